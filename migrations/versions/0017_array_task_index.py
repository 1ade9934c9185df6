"""Array tasks are found by (array id, task id) in one seek: hcancel naming tasks that ended
looked them up through an index of the array id alone, reading up to every task of each array.
The new index leads with the array id, so it also serves every lookup the old one did.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_array_task", "jobs", ["array_job_id", "array_task_id"])
    op.drop_index("ix_jobs_array_job_id", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_array_job_id", "jobs", ["array_job_id"])
    op.drop_index("ix_jobs_array_task", table_name="jobs")
