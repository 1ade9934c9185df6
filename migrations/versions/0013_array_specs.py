"""An array's spec is stored once (array_specs), not copied into every task: one 256 KiB script
with --array=0-1000 used to write 252 MB. jobs.spec_bytes counts what each row stores, so that
[limits] max_pending_bytes bounds a user's pending jobs in the store; an index on (user, state,
spec_bytes) answers that count (and the per-user job counts) from the index alone, at every
submission. Rows from before keep
their full spec (spec_bytes NULL counts as 0) and are read as before.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "array_specs",
        sa.Column("array_job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("spec", sa.JSON, nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spec_bytes", sa.Integer))
        batch.create_index("ix_jobs_user_state", ["user", "state", "spec_bytes"])


def downgrade() -> None:
    # Tasks of arrays submitted since hold only their changes: give each its full spec back.
    conn = op.get_bind()
    meta = sa.MetaData()
    jobs = sa.Table("jobs", meta, autoload_with=conn)
    array_specs = sa.Table("array_specs", meta, autoload_with=conn)
    for array_id, spec in conn.execute(sa.select(array_specs.c.array_job_id, array_specs.c.spec)).all():
        for job_id, own in conn.execute(sa.select(jobs.c.id, jobs.c.spec).where(jobs.c.array_job_id == array_id)).all():
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(spec={**spec, **(own or {})}))
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_user_state")
        batch.drop_column("spec_bytes")
    op.drop_table("array_specs")
