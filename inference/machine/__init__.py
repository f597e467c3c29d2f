"""Facts about the box the deploy side runs on (memory read from ``/proc``), for ``bench``, ``doctor`` and the
training side's profiler."""
