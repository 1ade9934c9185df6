"""hshare: fair-share usage by account and user, like sshare -a."""
from __future__ import annotations

import getpass
import json

import click

from .common import call, print_table


def _num(x: float) -> str:
    return f"{x:.6f}"


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("-a", "--all", "all_users", is_flag=True, help="every user, not only you")
@click.option("-A", "--accounts", "accounts", help="only these accounts (comma list)")
@click.option("-u", "--users", "users", help="only these users (comma list)")
@click.option("-P", "--parsable", is_flag=True, help="'|' between fields, no padding")
@click.option("-n", "--noheader", is_flag=True, help="no header line")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def main(all_users, accounts, users, parsable, noheader, as_json):
    """Show the fair-share tree: shares, decayed GPU-second usage and the factor (1 = unused,
    0.5 = used exactly its share). Jobs with a higher factor go first within an MLFQ level."""
    reply = call("hshare", "shares", {})
    rows = reply["rows"]
    wanted_accounts = set(accounts.split(",")) if accounts else None
    wanted_users = set(users.split(",")) if users else (None if all_users else {getpass.getuser()})
    users_rows = [r for r in rows if r["user"] is not None and (wanted_users is None or r["user"] in wanted_users)]
    # an account's own row is shown with the users shown under it (all of them with -a)
    accounts_shown = {r["account"] for r in users_rows} if wanted_users is not None else {r["account"] for r in rows}
    shown = [r for r in rows if (wanted_accounts is None or r["account"] in wanted_accounts)
             and (r in users_rows or r["user"] is None and r["account"] in accounts_shown)]
    if as_json:
        print(json.dumps({"half_life": reply["half_life"], "rows": shown}, indent=2))
        return
    header = ["Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"]
    table = [[r["account"], r["user"] or "", str(r["raw_shares"]), _num(r["norm_shares"]),
              str(int(r["raw_usage"])), _num(r["effective_usage"]), _num(r["factor"])] for r in shown]
    if parsable:
        for line in ([header] if not noheader else []) + table:
            print("|".join(line))
        return
    print_table(header, table, header=not noheader, right={2, 3, 4, 5, 6})
