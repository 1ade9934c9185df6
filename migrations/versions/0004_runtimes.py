"""Runtimes: what each node can run jobs in, and what each job needs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("runtimes", sa.JSON))
        batch.add_column(sa.Column("container_runtime", sa.String(16)))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("runtime", sa.String(16)))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("runtime")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("container_runtime")
        batch.drop_column("runtimes")
