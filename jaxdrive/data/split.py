"""A deterministic training / validation split of real scenes, by scenario id.

A scene belongs to the validation split when the first 8 bytes of
``sha256("jaxdrive-split:" + scenario_id)``, read as a fraction of 2^64, fall below the
validation fraction (default 0.2); otherwise to the training split. The rule depends on
the scenario id only: the same scene lands in the same split whatever the file, its
layout (JSON, gzip, TFRecord), the order or the other scenes converted with it, so a
scene evaluated on is never trained on. ``data convert --split`` applies it.
"""

from __future__ import annotations

import hashlib
import math

from jaxdrive.config import ConfigError

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
DEFAULT_VALIDATION_FRACTION = 0.2
RULE = "sha256('jaxdrive-split:' + scenario_id)[:8] / 2**64 < validation_fraction"


def check_fraction(fraction: float) -> float:
    """``fraction`` if it is a finite number in (0, 1); else ConfigError."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or \
            not math.isfinite(fraction) or not 0 < fraction < 1:
        raise ConfigError(f"the validation fraction must be a number in (0, 1), got "
                          f"{fraction!r}")
    return float(fraction)


def split_of(scenario_id: str, validation_fraction: float = DEFAULT_VALIDATION_FRACTION
             ) -> str:
    """``"validation"`` or ``"train"`` for one scene (see the module doc)."""
    digest = hashlib.sha256(f"jaxdrive-split:{scenario_id}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    return VALIDATION if position < check_fraction(validation_fraction) else TRAIN
