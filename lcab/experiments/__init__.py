"""The benchmark CLI, `python -m lcab.experiments` (absl flags, flagfiles in experiments/).

flags.py and workload_flags.py define its flags, presets.py reads the preset
flagfiles, sweep.py turns settings into cases, launch.py runs them in the
right processes, and __main__.py holds main.
"""
