"""The user API on top of the runtime: DistArray, elementwise ops, HeAT-style
split axes, pencil FFTs, HDF5 I/O."""
