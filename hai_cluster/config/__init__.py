"""The one place that turns config files (TOML) into typed settings: agent.toml (agent.py),
controller.toml (controller.py), and what both read them with (common.py).

Every error names the file and the key, and nothing starts on a config it does not understand.
"""
from .common import ConfigError, Section, positive, read_toml, resolve
from .agent import (
    DEFAULT_CRITICAL_XIDS, DEFAULT_RLIMITS, RLIMIT_NAMES, AdoptConfig, AgentConfig, AgentTelemetryConfig, IsolationConfig,
    SharingConfig, SimulatedGpus, load_agent_config)
from .controller import (
    DEFAULT_ACCOUNT, USER_LIMIT_DEFAULTS, AccessConfig, AccountConfig, ControllerConfig, FairShareConfig,
    LimitsConfig, NodeConfig, PartitionConfig, SchedulerConfig, SshConfig, TelemetryConfig,
    load_controller_config, parse_scheduler)

__all__ = [
    "ConfigError", "Section", "positive", "read_toml", "resolve", "DEFAULT_CRITICAL_XIDS", "DEFAULT_RLIMITS",
    "RLIMIT_NAMES", "AdoptConfig", "AgentConfig", "AgentTelemetryConfig", "IsolationConfig", "SharingConfig",
    "SimulatedGpus", "load_agent_config", "DEFAULT_ACCOUNT", "USER_LIMIT_DEFAULTS", "AccessConfig",
    "AccountConfig", "ControllerConfig", "FairShareConfig", "LimitsConfig", "NodeConfig", "PartitionConfig",
    "SchedulerConfig", "SshConfig", "TelemetryConfig", "load_controller_config", "parse_scheduler",
]
