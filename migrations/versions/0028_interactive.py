"""Interactive allocations (salloc, srun outside a job): the class the scheduler's snapshot reads
and the [interactive] limits count.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch (see 0020: a batch rebuild of jobs cascades on SQLite).
def upgrade() -> None:
    op.add_column("jobs", sa.Column("interactive", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("jobs", "interactive")
