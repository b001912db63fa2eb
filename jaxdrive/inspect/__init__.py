"""Inspection of a policy's memory over one multi-trial episode: the probe rollout
(``probe``), the event trace (``trace``), PNG plots of attention and the KV cache
(``plots``) and ``python -m jaxdrive.inspect`` (``cli``)."""
