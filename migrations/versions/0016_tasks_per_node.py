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


# Plain ALTER TABLE, not a batch: a batch rebuilds jobs on SQLite, and dropping the old table
# (foreign keys on) deletes through ON DELETE CASCADE every run and array spec that names a job.
def upgrade() -> None:
    op.add_column("jobs", sa.Column("tasks_per_node", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    op.drop_column("jobs", "tasks_per_node")  # SQLite 3.35+ (Debian 12 has 3.40)
