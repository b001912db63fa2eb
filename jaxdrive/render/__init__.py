"""Rendering: top-down frames rasterised on device (``raster``), recorded rollouts whose
frames come out of the rollout's scan in bounded chunks (``record``), overlays and mp4 /
PNG output (``video``), and ``python -m jaxdrive.render`` (``cli``)."""
