"""-C/--constraint: the job's feature expression and each node's declared features.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch (see 0020: a batch rebuild of jobs cascades on SQLite).
def upgrade() -> None:
    op.add_column("jobs", sa.Column("constraint", sa.String(1024)))
    op.add_column("nodes", sa.Column("features", sa.JSON))


def downgrade() -> None:
    op.drop_column("nodes", "features")
    op.drop_column("jobs", "constraint")
