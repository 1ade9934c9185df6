"""Test infrastructure: network namespaces, private sshd and PostgreSQL, and pytest fixtures."""
