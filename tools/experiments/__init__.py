"""The paper's tables as experiments: grids of bundle runs, run resumably, collected into CSVs, reported as pages.

Modules, each importing only those above it: ``vocabulary`` (methods, presets, ablations, the paper's numbers),
``grid`` (a preset as bundle runs), ``runner`` (runs a grid, skipping finished runs), ``collection`` (finished runs
into one CSV), ``tables`` (CSV rows into the paper's tables), ``sections`` and ``figures`` (a report's parts),
``report`` (one protocol's page), ``pages`` (the committed pages under docs/results), ``cli`` (the command line:
``python tools/experiments.py COMMAND``).
"""
