"""Initial schema: jobs, runs, run ranks, nodes, GPUs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("uid", sa.Integer, nullable=False),
        sa.Column("gid", sa.Integer, nullable=False),
        sa.Column("partition", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("submit_time", sa.Float, nullable=False),
        sa.Column("start_time", sa.Float),
        sa.Column("end_time", sa.Float),
        sa.Column("nodes", sa.Integer, nullable=False),
        sa.Column("gpus_per_node", sa.Integer, nullable=False),
        sa.Column("cpus_per_task", sa.Integer, nullable=False),
        sa.Column("mem_mb", sa.Integer),
        sa.Column("time_limit", sa.Integer),
        sa.Column("hold", sa.Boolean, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("restart_count", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_signal", sa.Integer),
        sa.Column("nodelist", sa.String(1000), nullable=False),
        sa.Column("end_request", sa.String(16)),
        sa.Column("attained_gpu_seconds", sa.Float, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("start_time", sa.Float, nullable=False),
        sa.Column("end_time", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_signal", sa.Integer),
        sa.Column("nodelist", sa.String(1000), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("reason", sa.String(200)),
        sa.UniqueConstraint("job_id", "attempt", name="uq_runs_job_attempt"),
    )
    op.create_table(
        "run_ranks",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("node", sa.String(64), nullable=False),
        sa.Column("gpus", sa.JSON, nullable=False),
        sa.Column("cpus", sa.Integer, nullable=False),
        sa.Column("mem_mb", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_signal", sa.Integer),
        sa.Column("reason", sa.String(32)),
        sa.Column("killed", sa.Boolean, nullable=False),
        sa.Column("message", sa.Text),
        sa.Column("end_time", sa.Float),
    )
    op.create_index("ix_run_ranks_node_state", "run_ranks", ["node", "state"])
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(200)),
        sa.Column("responding", sa.Boolean, nullable=False),
        sa.Column("cpus", sa.Integer, nullable=False),
        sa.Column("mem_mb", sa.Integer, nullable=False),
        sa.Column("gpu_backend", sa.String(16)),
        sa.Column("partitions", sa.JSON, nullable=False),
        sa.Column("last_seen", sa.Float),
    )
    op.create_table(
        "gpus",
        sa.Column("node", sa.String(64), sa.ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("index", sa.Integer, primary_key=True),
        sa.Column("uuid", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gpus")
    op.drop_table("nodes")
    op.drop_index("ix_run_ranks_node_state", table_name="run_ranks")
    op.drop_table("run_ranks")
    op.drop_table("runs")
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_table("jobs")
