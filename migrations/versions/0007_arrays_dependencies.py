"""Jobs: job arrays (one row per task) and dependencies.

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_job_id", sa.Integer))
        batch.add_column(sa.Column("array_task_id", sa.Integer))
        batch.add_column(sa.Column("array_task_limit", sa.Integer))
        batch.add_column(sa.Column("dependency", sa.String(1000)))
        batch.create_index("ix_jobs_array_job_id", ["array_job_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_array_job_id")
        batch.drop_column("dependency")
        batch.drop_column("array_task_limit")
        batch.drop_column("array_task_id")
        batch.drop_column("array_job_id")
