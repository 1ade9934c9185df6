"""--qos: the job's named QOS ([[qos]] tables of controller.toml), for its per-user limits and listings.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch (see 0020: a batch rebuild of jobs cascades on SQLite).
def upgrade() -> None:
    op.add_column("jobs", sa.Column("qos", sa.String(64)))


def downgrade() -> None:
    op.drop_column("jobs", "qos")
