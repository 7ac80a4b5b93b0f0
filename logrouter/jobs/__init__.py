"""Batch jobs run as separate processes (never imported by the daemon's reactor code).

* ``compact`` - the Spark compaction job (``python -m logrouter.jobs.compact`` or
  ``spark-submit logrouter/jobs/compact.py``).
"""
