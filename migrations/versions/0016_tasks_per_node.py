"""Tasks are part of a job's request (-n/--ntasks, --ntasks-per-node): every node of a job holds
the same number of them, and a rank takes that many times --cpus-per-task CPUs. Jobs submitted
before had one task per node.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("tasks_per_node", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("tasks_per_node")
