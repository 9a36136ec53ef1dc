"""Checks of what the user typed, made before anything trains: a message that names the field and
the fix beats a traceback from deep inside Lightning or a run that quietly does the wrong thing.

Most run on the parsed config before anything is built; those of ``model`` where their facts first
exist (as the model is built, once the run's steps are known). None of them changes what a training
step computes: a reader following the step may skip this package.
"""
