"""The run directory: where a run writes, which checkpoint a command resumes or evaluates, and
keeping what earlier commands wrote there.

Every command works in one ``<save_dir>/<name>/<version>/`` folder: ``fit`` in a new one (or, when it
resumes, in its checkpoint's), ``validate``/``test``/``predict`` in the folder of the checkpoint they
evaluate. A process holds its folder with a lock for as long as it runs, so two commands never
interleave their files.

Nothing is imported here: ``projkit.errors`` imports the lock, and ``ckpt_path`` imports the checks,
which import ``projkit.errors``.
"""
