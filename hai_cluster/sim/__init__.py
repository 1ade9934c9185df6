"""hai-sim: replay GPU-cluster traces through the production scheduling policies.

traces (loaders, format detection, load scaling) -> cluster (nodes, job shapes) -> engine (virtual
clock, calls `make_policy(name).decide(snapshot)` exactly as the controller does) -> metrics ->
report (table, CSV, JSON, plot). cli wires them together.
"""
