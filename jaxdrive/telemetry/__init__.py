"""Run telemetry: on-device statistics (host-side writers come with the trainer)."""
