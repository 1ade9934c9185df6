"""Alembic environment: the URL and connection come from hai_cluster.store.engine."""
from alembic import context

from hai_cluster.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")

if connection is None:
    raise RuntimeError("run migrations through hai_cluster.store.engine.upgrade()")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
