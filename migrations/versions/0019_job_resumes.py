"""How a job resumes after a preemption (JobSpec.resumes): time-slicing preempts only jobs that
said they can (--requeue, --checkpoint-dir, --signal, or their processes at run time). Jobs
submitted before this revision said nothing: they are no longer preempted by time-slicing.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch: a batch rebuilds jobs on SQLite, and dropping the old table
# (foreign keys on) deletes through ON DELETE CASCADE every run and array spec that names a job.
def upgrade() -> None:
    op.add_column("jobs", sa.Column("resumes", sa.String(16)))


def downgrade() -> None:
    op.drop_column("jobs", "resumes")  # SQLite 3.35+ (Debian 12 has 3.40)
