"""Rendering: top-down frames rasterised on device (``raster``), jittable and vmappable."""
