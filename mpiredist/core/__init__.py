"""Core values: meshes, layouts, prime-factor sub-axes, block geometry, errors.

Pure Python and numpy; no MPI.  Every other layer builds on these.
"""
