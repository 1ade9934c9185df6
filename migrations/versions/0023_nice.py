"""--nice: the job's adjustment of its place in its queue, a column the scheduler's snapshot reads.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch (see 0020: a batch rebuild of jobs cascades on SQLite).
def upgrade() -> None:
    op.add_column("jobs", sa.Column("nice", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "nice")
