"""Code shared by the BIM bundles (network, GPU data store and augmentation, schedule, engine utilities).

Every bundle's ``scripts/__init__.py`` puts ``bundles/`` (this package's parent) and the repository root on
``sys.path``, so bundles import this package instead of copying it.
"""
