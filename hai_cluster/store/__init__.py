"""The job store: schema, migrations' engine, the repository of reads and writes, the applier of a
pass's starts, the views the policy sees."""
