"""Host side of recordings: overlays, mp4 encoding, file names that never collide.

Videos go to ``OUT/PRODUCER/VIEW/stepSTEP_envENV.mp4``: each producer (``train``, the
render CLI, an evaluator) owns its directory, names carry the run step and the env
index, and a name already taken (say, by an earlier run into the same directory) gets a
``-2``, ``-3`` ... suffix: files are claimed with an exclusive create, never
overwritten; producer and view names are confined to ``OUT`` (``jaxdrive.files.confined``:
a name such as ``../x`` is an ``UnsafeNameError``, never a file outside). Frames reach
ffmpeg (imageio-ffmpeg's packaged binary, no system ffmpeg) as they arrive, one chunk at
a time.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxdrive.files import atomic_write_bytes, confined, safe_name
from jaxdrive.render.record import FrameInfo, Recorder


@contextlib.contextmanager
def _quiet_fork():
    """JAX warns about os.fork() in threaded programs; starting ffmpeg forks and execs at
    once, which is safe."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*os.fork", category=RuntimeWarning)
        yield


def claim_path(directory: str | os.PathLike, stem: str, suffix: str) -> Path:
    """Create and return ``directory/stem{suffix}`` or, if taken, ``stem-2{suffix}``, ...

    The file is created empty with an exclusive open, so two writers (threads,
    processes, runs) never get the same path.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = directory / (f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            n += 1


def video_path(out_dir: str | os.PathLike, producer: str, view: str, step: int,
               env_index: int) -> Path:
    """Claim ``out_dir/producer/view/step{step:010d}_env{env_index:03d}.mp4``.

    Raises:
      UnsafeNameError: ``producer`` or ``view`` would lead outside ``out_dir``.
    """
    directory = confined(out_dir, producer, safe_name(view, "view name"))
    return claim_path(directory, f"step{step:010d}_env{env_index:03d}", ".mp4")


def overlay_lines(info: FrameInfo, frame: int, env: int, num_trials: int) -> list[str]:
    """Text of one frame's overlay from host-side ``FrameInfo`` arrays (n, B)."""
    lines = [f"step {int(info.step[frame, env])}"]
    if num_trials > 1:
        lines.append(f"trial {int(info.trial[frame, env]) + 1} / {num_trials}")
    lines.append(f"goal {int(info.at_goal[frame, env])}/{int(info.controlled[frame, env])}"
                 f"  coll {int(info.collided[frame, env])}"
                 f"  off {int(info.offroad[frame, env])}")
    return lines


_FONT = None


def _font():
    global _FONT
    if _FONT is None:
        from PIL import ImageFont

        try:  # a scalable font when Pillow has FreeType, else its bitmap font
            _FONT = ImageFont.load_default(size=11)
        except (TypeError, ImportError, OSError):
            _FONT = ImageFont.load_default()
    return _FONT


def draw_overlay(frame: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """A copy of ``frame`` (H, W, 3) uint8 with ``lines`` written at the top left on a
    darkened band."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(np.ascontiguousarray(frame))
    draw = ImageDraw.Draw(image)
    font = _font()
    y = 2
    boxes = [draw.textbbox((3, 0), line, font=font) for line in lines]
    height = sum(b[3] - b[1] + 2 for b in boxes) + 4
    width = max((b[2] for b in boxes), default=0) + 3
    band = np.asarray(image).copy()
    band[:height, :width] = band[:height, :width] // 3
    image = Image.fromarray(band)
    draw = ImageDraw.Draw(image)
    for line, b in zip(lines, boxes, strict=True):
        draw.text((3, y - b[1]), line, fill=(255, 255, 255), font=font)
        y += b[3] - b[1] + 2
    return np.asarray(image)


class VideoWriter:
    """One mp4 fed frame by frame through imageio-ffmpeg's packaged ffmpeg.

    Frames go to a hidden sibling file; ``close`` renames it to ``path`` and ``abort``
    removes it, so ``path`` is a complete video or absent (a stop or an error mid-video
    leaves nothing half written)."""

    def __init__(self, path: str | os.PathLike, width: int, height: int, fps: int = 10):
        import imageio_ffmpeg

        self.path = Path(path)
        # ffmpeg picks the container from the extension: keep ".mp4" last.
        self._partial = self.path.with_name(f".{self.path.stem}.{os.getpid()}.partial"
                                            f"{self.path.suffix}")
        self.frames = 0
        with _quiet_fork():
            self._gen = imageio_ffmpeg.write_frames(
                str(self._partial), (width, height), fps=fps, codec="libx264",
                pix_fmt_in="rgb24", pix_fmt_out="yuv420p", macro_block_size=2,
                ffmpeg_log_level="error",
            )
            self._gen.send(None)  # start ffmpeg

    def write(self, frames: np.ndarray) -> None:
        """Append (n, H, W, 3) uint8 frames."""
        for f in frames:
            self._gen.send(np.ascontiguousarray(f, dtype=np.uint8))
            self.frames += 1

    def close(self) -> None:
        """Finish the mp4 (ends ffmpeg's input) and publish it at ``path``; safe to call
        twice."""
        if self._gen is not None:
            gen, self._gen = self._gen, None
            try:
                gen.close()
            except BaseException:
                self._partial.unlink(missing_ok=True)
                raise
            os.replace(self._partial, self.path)

    def abort(self) -> None:
        """Stop ffmpeg and remove the unfinished file (``path`` is left as it was)."""
        if self._gen is not None:
            gen, self._gen = self._gen, None
            try:
                gen.close()
            finally:
                self._partial.unlink(missing_ok=True)


class VideoSink:
    """A ``record`` sink writing one mp4 per env per view (see the module doc).

    Attributes after ``close``: ``paths[(env_index, view)]``, the mp4 files, and
    ``max_chunk``, the most frames it held at once.
    """

    def __init__(self, recorder: Recorder, out_dir: str | os.PathLike, producer: str,
                 step: int, env_indices: Sequence[int] | None = None):
        c = recorder.config
        self.recorder = recorder
        self.env_indices = list(env_indices if env_indices is not None else range(c.num_envs))
        if len(self.env_indices) != c.num_envs:
            raise ValueError(f"env_indices has {len(self.env_indices)} entries for "
                             f"{c.num_envs} recorded envs.")
        self.paths: dict[tuple[int, str], Path] = {}
        self._writers: dict[tuple[int, int], VideoWriter] = {}
        self.max_chunk = 0
        try:
            for b, env_index in enumerate(self.env_indices):
                for v, view in enumerate(c.views):
                    path = video_path(out_dir, producer, view, step, env_index)
                    self.paths[(env_index, view)] = path
                    self._writers[(b, v)] = VideoWriter(path, c.width, c.height, c.fps)
        except BaseException:
            self.abort()
            raise

    def __call__(self, first: int, frames: np.ndarray, info: FrameInfo) -> None:
        del first
        self.max_chunk = max(self.max_chunk, frames.shape[0])
        trials = self.recorder.num_trials
        for (b, v), writer in self._writers.items():
            out = frames[:, b, v]
            if self.recorder.config.overlay:
                out = np.stack([draw_overlay(f, overlay_lines(info, i, b, trials))
                                for i, f in enumerate(out)])
            writer.write(out)

    def close(self) -> None:
        """Finish every mp4; ``paths`` then name complete files."""
        try:
            for w in self._writers.values():
                w.close()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Stop every unfinished mp4 and remove its file and its claimed (empty) path
        (after an error or a stop)."""
        for w in self._writers.values():
            with contextlib.suppress(Exception):
                w.abort()
        for path in self.paths.values():
            with contextlib.suppress(OSError):
                if path.stat().st_size == 0:
                    path.unlink()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()


class FrameGrabber:
    """A ``record`` sink keeping one frame (with its overlay) of one env and view."""

    def __init__(self, recorder: Recorder, frame: int, env: int = 0, view: int = 0):
        self.recorder, self.frame, self.env, self.view = recorder, frame, env, view
        self.image: np.ndarray | None = None

    def __call__(self, first: int, frames: np.ndarray, info: FrameInfo) -> None:
        i = self.frame - first
        if 0 <= i < frames.shape[0]:
            image = frames[i, self.env, self.view]
            if self.recorder.config.overlay:
                lines = overlay_lines(info, i, self.env, self.recorder.num_trials)
                image = draw_overlay(image, lines)
            self.image = np.array(image)


def png_bytes(image: np.ndarray) -> bytes:
    """(H, W, 3) uint8 ``image`` encoded as a PNG file's bytes."""
    import imageio.v3 as iio

    return iio.imwrite("<bytes>", np.ascontiguousarray(image, dtype=np.uint8),
                       extension=".png")


def write_png(path: str | os.PathLike, image: np.ndarray) -> Path:
    """Write (H, W, 3) uint8 ``image`` as a PNG atomically (parent directories created):
    a reader sees the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_bytes(path, png_bytes(image))


def count_video_frames(path: str | os.PathLike) -> int:
    """Frames in a video file, decoded with the packaged ffmpeg."""
    import imageio_ffmpeg

    with _quiet_fork():
        gen = imageio_ffmpeg.read_frames(str(path))
        next(gen)  # metadata
    return sum(1 for _ in gen)
