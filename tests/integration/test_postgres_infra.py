"""The private PostgreSQL server used by store tests: it starts, and SQLAlchemy 2 + psycopg 3 work on it."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def test_sqlalchemy_creates_a_table_and_reads_it_back(postgres_url):
    import sqlalchemy as sa

    assert postgres_url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    engine = sa.create_engine(postgres_url)
    meta = sa.MetaData()
    jobs = sa.Table("jobs", meta, sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("name", sa.String(64), nullable=False))
    try:
        meta.create_all(engine)
        with engine.begin() as db:
            db.execute(jobs.insert(), [{"id": 1, "name": "train"}, {"id": 2, "name": "eval"}])
        with engine.connect() as db:
            rows = db.execute(sa.select(jobs.c.id, jobs.c.name).order_by(jobs.c.id)).all()
            assert [tuple(r) for r in rows] == [(1, "train"), (2, "eval")]
            assert db.execute(sa.text("select current_setting('server_version_num')::int")).scalar() >= 130000
    finally:
        engine.dispose()


def test_each_test_gets_a_fresh_database(postgres_url, postgres_server):
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    try:
        assert sa.inspect(engine).get_table_names() == []  # the table made by the other test is not here
        with engine.connect() as db:
            name = db.execute(sa.text("select current_database()")).scalar()
        assert postgres_url.endswith("/" + name)
        assert postgres_server.url(name) == postgres_url
    finally:
        engine.dispose()
