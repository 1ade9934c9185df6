"""What a run's cgroups were charged: CPU seconds and memory peaks, per rank and per run
(hacct AveCPU, sacct MaxRSS/AveRSS/AveCPU/TotalCPU).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE, not a batch (see 0020: a batch rebuild cascades on SQLite).
    op.add_column("run_ranks", sa.Column("cpu_seconds", sa.Float))
    op.add_column("run_ranks", sa.Column("mem_peak_kb", sa.BigInteger))
    op.add_column("runs", sa.Column("cpu_seconds", sa.Float))
    op.add_column("runs", sa.Column("max_rss_kb", sa.BigInteger))
    op.add_column("runs", sa.Column("ave_rss_kb", sa.BigInteger))


def downgrade() -> None:
    for column in ("ave_rss_kb", "max_rss_kb", "cpu_seconds"):
        op.drop_column("runs", column)
    for column in ("mem_peak_kb", "cpu_seconds"):
        op.drop_column("run_ranks", column)
