"""The worker process: what it does as it starts (``startup``), and a local worker that commands start for
themselves (``local``)."""
