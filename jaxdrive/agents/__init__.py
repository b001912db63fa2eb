"""Who drives: built-in controllers (``controllers``), the ``Actor`` interface over
controllers and policies (``actors``), and the scan rollout (``rollout``)."""
