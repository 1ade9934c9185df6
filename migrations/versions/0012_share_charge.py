"""Sharing runs are charged GPU-time by their share: the GPU-equivalents a run is charged per
second (runs.gpu_charge; NULL for whole-GPU runs, which are charged runs.gpus). MIG: a card's
instance layout (gpus.mig) and the instance a sharing rank holds (run_ranks.mig_uuid).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("gpu_charge", sa.Float))
    with op.batch_alter_table("run_ranks") as batch:
        batch.add_column(sa.Column("mig_uuid", sa.String(100)))
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("mig", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("mig")
    with op.batch_alter_table("run_ranks") as batch:
        batch.drop_column("mig_uuid")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gpu_charge")
