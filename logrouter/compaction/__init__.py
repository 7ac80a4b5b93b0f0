"""Compaction of the lake: small files of sealed partitions rewritten into a few big ones.

The daemon side and the lake side; the Spark side is ``logrouter.jobs.compact``, run
as a separate process (the daemon never imports pyspark).

* ``layout``    - partitions of a lake, compacted-file names, the sealing and "worth it" rules;
* ``lease``     - per-partition leases in the lake, so routers sharing a lake never
  compact the same partition at once;
* ``swap``      - the staging area, the commit marker and the swap steps, and recovery
  of a swap a crash interrupted (roll forward or back);
* ``merge``     - how files with differing schemas are merged without losing a value;
* ``options``   - the ``[compaction]`` config section;
* ``runner``    - running the job as a child process in its own process group;
* ``scheduler`` - ``CompactionService``: every ``schedule_secs`` pick partitions, take
  their leases, run the job one partition at a time, with a timeout and metrics.

Everything but ``scheduler`` and ``runner`` is synchronous code with no Twisted import.
"""
