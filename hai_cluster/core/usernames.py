"""What a login name may be, where a user name comes from outside (PAM_USER, config lists)."""
import re

# useradd's default NAME_REGEX on Debian (and the '$' of machine accounts), at most 32 characters
USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,30}[a-z0-9_.$-]?")


def valid_user_name(name: object) -> bool:
    return isinstance(name, str) and USER_NAME.fullmatch(name) is not None
