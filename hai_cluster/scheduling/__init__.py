"""Pure scheduling policies: decide(snapshot) -> Plan, no I/O, no clock. The pipeline and the
module of each stage: README.md here; the policies by name: registry.py."""
