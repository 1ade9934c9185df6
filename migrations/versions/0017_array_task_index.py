"""Array tasks are found by (array id, task id) in one seek, and an array's tasks are walked in
id order: hcancel naming tasks that ended looked them up through an index of the array id
alone, reading up to every task of each array, and a listing by array ids sorted every task of
them for each page (eleventh audit). Both new indexes lead with the array id, so they serve
every lookup the old one did.

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
    op.create_index("ix_jobs_array_id", "jobs", ["array_job_id", "id"])
    op.drop_index("ix_jobs_array_job_id", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_array_job_id", "jobs", ["array_job_id"])
    op.drop_index("ix_jobs_array_id", table_name="jobs")
    op.drop_index("ix_jobs_array_task", table_name="jobs")
