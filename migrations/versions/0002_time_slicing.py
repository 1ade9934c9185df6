"""Time-slicing: when a job last entered the queue and last ran, whether it may be preempted, why
its run was asked to end, and admin holds.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pending_since", sa.Float))
        batch.add_column(sa.Column("last_run_end", sa.Float))
        batch.add_column(sa.Column("preemptible", sa.Boolean, nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("end_reason", sa.String(300)))
        batch.add_column(sa.Column("hold_admin", sa.Boolean, nullable=False, server_default=sa.false()))
    # Jobs submitted before this revision entered the queue at submit time.
    op.execute("UPDATE jobs SET pending_since = submit_time")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("hold_admin")
        batch.drop_column("end_reason")
        batch.drop_column("preemptible")
        batch.drop_column("last_run_end")
        batch.drop_column("pending_since")
