"""Configuration: ``config/proxy.yaml`` overlaid by environment variables.

Precedence, highest first: ``COMPACTION_PROXY_*`` environment variables (nested keys with
``__``, e.g. ``COMPACTION_PROXY_POLICY__THRESHOLD_RATIO``; plus ``OPENAI_BASE_URL`` and
``REDIS_URL``), then the YAML file, then the defaults below. Unknown keys and invalid
combinations fail at start-up with a message naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    AliasChoices,
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from compaction_proxy.config import error_sources as config_errors

DEFAULT_CONFIG_PATH = Path("config/proxy.yaml")
CONFIG_PATH_ENV = "COMPACTION_PROXY_CONFIG"
# Set by ``serve --workers`` for its workers: one loopback secret for all
# (``security.loopback``); each process makes its own otherwise.
LOOPBACK_SECRET_ENV = "COMPACTION_PROXY_LOOPBACK_SECRET"
DEFAULT_UPSTREAM = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_UPSTREAM = "https://api.anthropic.com/v1"


class ConfigError(Exception):
    """Invalid configuration; the message names the offending key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrunerPolicy(_Strict):
    """Observations longer than ``threshold_chars`` code points keep only head and tail.

    Tool and legacy function results are observations; so are, when ``user_messages`` is on,
    the user messages in which agents without native tool calling return their outputs, on the
    conversation's evidence (``conversation.agent_outputs``); a person's words never are. The
    live turn is never pruned.
    """

    threshold_chars: PositiveInt = 8192
    head_chars: int = Field(default=4096, ge=0)
    tail_chars: int = Field(default=1024, ge=0)
    user_messages: bool = True
    # With precompaction on, a request that reaches must_compact while its checkpoint is
    # still to come goes at once with older observations cut harder, to these sizes, for
    # that request alone (proxy/compaction/bridge.py); false: it waits for the summary.
    bridge: bool = True
    bridge_head_chars: int = Field(default=1024, ge=0)
    bridge_tail_chars: int = Field(default=256, ge=0)

    @model_validator(mode="after")
    def _head_and_tail_fit(self) -> Self:
        if self.head_chars + self.tail_chars >= self.threshold_chars:
            raise ValueError("head_chars + tail_chars must be below threshold_chars")
        if self.bridge_head_chars + self.bridge_tail_chars >= self.head_chars + self.tail_chars:
            raise ValueError(
                "bridge_head_chars + bridge_tail_chars must be below head_chars + tail_chars"
            )
        return self


class MaskingPolicy(_Strict):
    """Old observations cleared to a one-line placeholder before any summary is paid for
    (compaction/masking.py): ``keep`` newest observations are never cleared, nor those
    of the tools in ``exclude_tools``; a step is taken only when it frees at least
    ``clear_at_least`` tokens (unset: a tenth of the window)."""

    enabled: bool = True
    keep: int = Field(default=3, ge=0)
    exclude_tools: tuple[str, ...] = ()
    clear_at_least: int | None = Field(default=None, ge=0)


PricePreset = Literal["auto", "anthropic", "openai", "openai-5.6", "deepseek", "none"]


class PricingPolicy(_Strict):
    """How the route's provider bills a prompt it caches, in multiples of an uncached input
    token (compaction/cache_prices.py): a preset, any of its figures overridden. ``auto``:
    ``anthropic`` for requests in Anthropic's Messages format; for the others ``openai-5.6``
    for a model of OpenAI's GPT-5.6 family or a later one, ``openai`` otherwise."""

    preset: PricePreset = "auto"
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)
    output: float | None = Field(default=None, ge=0)
    cache_lifetime_seconds: float | None = Field(default=None, ge=0)


class PolicyOverrides(_Strict):
    """A partial policy: any key left out keeps the value it overrides."""

    threshold_ratio: float | None = Field(default=None, gt=0, le=1)
    precompact_ratio: float | None = Field(default=None, ge=0, lt=1)
    retain_ratio: float | None = Field(default=None, ge=0, lt=1)
    retain_tokens: int | None = Field(default=None, ge=0)
    max_tokens: PositiveInt | None = None
    compaction_retries: int | None = Field(default=None, ge=0)
    max_overflow_retries: int | None = Field(default=None, ge=0)
    auto: bool | None = None
    summary_model: str | None = None
    pruner: PrunerPolicy | None = None
    masking: MaskingPolicy | None = None
    rescue_live_turn: bool | None = None
    pricing: PricingPolicy | None = None
    target_tokens: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_retain_form(self) -> Self:
        if self.retain_ratio is not None and self.retain_tokens is not None:
            raise ValueError("give either retain_ratio or retain_tokens, not both")
        return self


PRECOMPACT_LEAD = 0.1  # default distance of precompact_ratio below threshold_ratio


class Policy(_Strict):
    """A complete compaction policy (DESIGN.md §6 defaults)."""

    threshold_ratio: float = Field(default=0.8, gt=0, le=1)
    # Pressure at which a checkpoint is prepared in the background, ahead of the threshold;
    # unset: threshold_ratio - PRECOMPACT_LEAD. 0 turns background compaction off.
    precompact_ratio: float | None = Field(default=None, ge=0, lt=1)
    retain_ratio: float | None = Field(default=0.10, ge=0, lt=1)
    retain_tokens: int | None = Field(default=None, ge=0)
    max_tokens: PositiveInt = 8192
    compaction_retries: int = Field(default=1, ge=0)
    max_overflow_retries: int = Field(default=1, ge=0)
    auto: bool = True
    summary_model: str | None = None
    pruner: PrunerPolicy = PrunerPolicy()
    masking: MaskingPolicy = MaskingPolicy()
    # A request whose live turn alone cannot fit the window has its largest live observations
    # cut to fit, rather than fail for certain (compaction/rescue.py); false: sent as it came.
    rescue_live_turn: bool = True
    pricing: PricingPolicy = PricingPolicy()
    # A soft target under the context window: the watermarks are worked out from it, and a
    # step between them and the window's own is taken only where the provider's prices say
    # it pays (compaction/cache_prices.py). Unset: the window alone.
    target_tokens: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _retain_tokens_replaces_default_ratio(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("retain_tokens") is not None:
            if data.get("retain_ratio") is not None:
                raise ValueError("give either retain_ratio or retain_tokens, not both")
            data = {**data, "retain_ratio": None}
        return data

    @model_validator(mode="after")
    def _retain_below_threshold(self) -> Self:
        if self.retain_ratio is None and self.retain_tokens is None:
            raise ValueError("one of retain_ratio or retain_tokens is required")
        if self.retain_ratio is not None and self.retain_ratio >= self.threshold_ratio:
            raise ValueError(
                f"retain_ratio ({self.retain_ratio}) must be below "
                f"threshold_ratio ({self.threshold_ratio})"
            )
        if self.precompact_ratio and self.precompact_ratio >= self.threshold_ratio:
            raise ValueError(
                f"precompact_ratio ({self.precompact_ratio}) must be below "
                f"threshold_ratio ({self.threshold_ratio}), or 0 to turn it off"
            )
        return self

    @property
    def effective_precompact_ratio(self) -> float:
        """The background watermark in force (0: off)."""
        if self.precompact_ratio is not None:
            return self.precompact_ratio
        return max(0.0, self.threshold_ratio - PRECOMPACT_LEAD)


class ModelOverride(PolicyOverrides):
    """Overrides for one exact model name within a route: policy keys directly under the
    model, or under ``policy:`` as a route writes them (both shapes read alike)."""

    context_window: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _policy_as_a_route_writes_it(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("policy"), dict):
            return data
        nested = data["policy"]
        flat = {key: value for key, value in data.items() if key != "policy"}
        both = sorted(set(flat) & set(nested))
        if both:
            raise ValueError(f"{', '.join(both)} given both under policy: and beside it")
        return {**flat, **nested}


class Route(_Strict):
    """Requests whose ``model`` matches ``model`` (a name or a glob) go to ``base_url``."""

    model: str
    base_url: AnyHttpUrl
    api_key_env: str | None = None
    # With api_key_env: whether clients may reach what the upstream account keeps (files,
    # batches, stored responses...) through the route's shared key: refused, shared, or owned
    # (each client key its own objects; security.account_endpoints, security.owned_objects).
    account_endpoints: Literal["refused", "shared", "owned"] = "refused"
    # The providers' own compaction APIs (/v1/responses/compact, a Responses
    # ``compaction_trigger``): made by the proxy (serve), passed to the upstream (relay), or
    # relayed only to the providers known to have them (auto; config.native_compaction).
    native_compaction: Literal["auto", "serve", "relay"] = "auto"
    context_window: PositiveInt | None = None
    policy: PolicyOverrides = PolicyOverrides()
    models: dict[str, ModelOverride] = {}

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _empty_means_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def base(self) -> str:
        return str(self.base_url).rstrip("/")


MIN_ADMIN_TOKEN_CHARS = 16


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="COMPACTION_PROXY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        populate_by_name=True,
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    upstream_base_url: AnyHttpUrl = Field(
        default=AnyHttpUrl(DEFAULT_UPSTREAM),
        validation_alias=AliasChoices(
            "upstream_base_url", "COMPACTION_PROXY_UPSTREAM_BASE_URL", "OPENAI_BASE_URL"
        ),
    )
    upstream_api_key_env: str | None = None
    # Where Anthropic-format requests (/v1/messages...) go when no route matches their model.
    anthropic_base_url: AnyHttpUrl = Field(
        default=AnyHttpUrl(DEFAULT_ANTHROPIC_UPSTREAM),
        validation_alias=AliasChoices("anthropic_base_url", "COMPACTION_PROXY_ANTHROPIC_BASE_URL"),
    )
    # The key (an environment variable's name) sent as x-api-key on the Anthropic catch-all
    # route: what reaches the model list, message batches and unrouted models under it.
    anthropic_api_key_env: str | None = None
    # The catch-all routes' account_endpoints and native_compaction (see Route).
    account_endpoints: Literal["refused", "shared", "owned"] = "refused"
    native_compaction: Literal["auto", "serve", "relay"] = "auto"
    upstream_connect_timeout: float = Field(default=10.0, gt=0)
    upstream_read_timeout: float = Field(default=600.0, gt=0)
    upstream_pool_size: PositiveInt = 256
    # Requests one client (an API key, else an address) has upstream at once; past it they
    # wait for one of its own (default: three quarters of upstream_pool_size).
    max_upstream_requests_per_client: PositiveInt | None = None
    # Relayed paths (files, audio, batches, Realtime...) have a pool of their own, so they can
    # never take the connections chat, Responses and summary calls need.
    relay_pool_size: PositiveInt = 64
    # A body still arriving (an upload relayed as it comes, or a chat, Responses or Messages
    # body read whole) is given up with 408 after this many seconds without a byte, or when,
    # past its first ``upload_grace_seconds``, any such span brings fewer than
    # ``upload_min_bytes_per_second`` a second (0: no minimum rate).
    upload_idle_timeout_seconds: float = Field(default=30.0, gt=0)
    upload_grace_seconds: float = Field(default=10.0, gt=0)
    upload_min_bytes_per_second: float = Field(default=1024.0, ge=0)
    # Uploads held at once: per client (its key, else its address), per source address
    # whatever keys it sends, and in all (default: three quarters of relay_pool_size, the rest
    # kept for the relayed requests that are not uploads).
    max_uploads_per_client: PositiveInt = 4
    max_uploads_per_address: PositiveInt = 16
    max_uploads: PositiveInt | None = None
    # Seconds between pings on each side of a relayed WebSocket; 0: none.
    websocket_heartbeat_seconds: float = Field(default=30.0, ge=0)
    store_url: str = Field(
        default="memory://",
        validation_alias=AliasChoices("store_url", "COMPACTION_PROXY_STORE_URL", "REDIS_URL"),
    )
    store_ttl_seconds: float = Field(default=7 * 86400, gt=0)
    # Replacement records (checkpoint summaries, stored in clear since they are forwarded)
    # expire this long after a conversation's last request; unset: store_ttl_seconds.
    record_ttl_seconds: float | None = Field(default=None, gt=0)
    # Connections one process opens to Redis at most, every command's (the request path's
    # commands keep up to half of them between commands: store/redis_direct.py).
    store_pool_size: PositiveInt = 50
    store_socket_timeout: float = Field(default=2.0, gt=0)
    store_connect_timeout: float = Field(default=1.0, gt=0)
    # While a shared store is out of reach, go on with this process's own copy of the
    # conversations it serves, summaries included (store/fallback.py); off: model-free
    # relief from the request alone.
    store_fallback: bool = True
    # Set where several replicas share this configuration (the Helm chart sets it with more
    # than one replica or autoscaling): the in-process store is refused, since each replica
    # would hold its own part of every conversation.
    require_shared_store: bool = False
    memory_max_conversations: PositiveInt = 10_000
    memory_max_bytes: PositiveInt = 512 * 1024 * 1024
    log_max_events: int = Field(default=10_000, ge=100)
    # Bytes of one conversation's log, whatever the store: past it, its oldest events are
    # dropped (counted, logged once); compaction works from the request itself.
    log_max_bytes: PositiveInt = 16 * 1024 * 1024
    # Redis: the log's older events packed into zstd segments (store/log_segments.py); logs
    # written either way, by any version, read alike.
    log_compression: bool = True
    meter_cache_size: PositiveInt = 200_000
    # Bytes of recently seen messages kept to skip validating and hashing them again.
    known_messages_bytes: NonNegativeInt = 64 * 1024 * 1024
    # Bytes of recent chat bodies kept (counted four times over, for their parsed messages) so
    # that a body extending one is parsed from where it differs; 0 turns this off.
    recent_bodies_bytes: NonNegativeInt = 256 * 1024 * 1024
    lease_ttl_seconds: float = Field(default=15.0, ge=1)
    summary_timeout_seconds: float = Field(default=90.0, gt=0)
    summary_breaker_cooldown_seconds: float = Field(default=60.0, ge=0)
    max_compaction_rounds: PositiveInt = 8
    failure_cooldown_seconds: float = Field(default=300.0, ge=0)
    failure_growth_ratio: float = Field(default=0.1, ge=0)
    summaries_per_minute_per_tenant: int = Field(default=60, ge=0)
    summaries_per_minute_per_route: int = Field(default=600, ge=0)
    # Background compaction rounds at once in one process (see policy.precompact_ratio); a
    # tenant's within ``compaction.background.may_take_a_slot``.
    precompact_concurrency: int = Field(default=8, ge=0)
    checkpoint_miss_limit: int = Field(default=3, ge=0)
    max_body_bytes: PositiveInt = 32 * 1024 * 1024
    log_content: bool = True
    # Messages with more text than this are logged by hash and digest only.
    log_content_max_chars: PositiveInt = 1024 * 1024
    tenant_secret: SecretStr | None = None
    # Client keys (SHA-256 digests), required once any route holds an upstream key.
    client_keys_file: str | None = None
    client_key_digests: list[str] = []
    admin_token: SecretStr | None = None
    shutdown_timeout: float = Field(default=30.0, ge=0)
    # Worker processes on one port (SO_REUSEPORT); more than one needs a Redis store.
    workers: int = Field(default=1, ge=1, le=256)
    log_level: str = "INFO"
    policy: Policy = Policy()
    routes: list[Route] = []

    @field_validator(
        "tenant_secret",
        "admin_token",
        "upstream_api_key_env",
        "anthropic_api_key_env",
        mode="before",
    )
    @classmethod
    def _empty_means_unset(cls, value: Any) -> Any:
        # Compose files and charts pass ``VAR: ${VAR:-}``: an empty secret is no secret.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("admin_token")
    @classmethod
    def _admin_token_is_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"admin_token must be at least {MIN_ADMIN_TOKEN_CHARS} characters "
                "(e.g. `openssl rand -hex 24`), or unset to turn the admin API off"
            )
        return value

    @property
    def upstream_share(self) -> int:
        """Requests one client has upstream at once (``security.upstream_shares``)."""
        if self.max_upstream_requests_per_client is not None:
            return self.max_upstream_requests_per_client
        return max(1, self.upstream_pool_size * 3 // 4)

    @property
    def upload_slots_total(self) -> int:
        """Uploads held at once in all: ``max_uploads``, never the whole relay pool."""
        share = max(1, self.relay_pool_size * 3 // 4)
        return share if self.max_uploads is None else min(self.max_uploads, share)

    @model_validator(mode="after")
    def _workers_share_a_store(self) -> Self:
        if self.workers > 1 and self.store_url.startswith("memory://"):
            raise ValueError(
                f"workers {self.workers} needs a store the workers share: set store_url (or "
                "REDIS_URL) to a Redis URL; with the in-process store each worker would see "
                "a different part of every conversation"
            )
        if self.require_shared_store and self.store_url.startswith("memory://"):
            raise ValueError(
                "require_shared_store: several replicas share this configuration, and the "
                "in-process store would give each its own part of every conversation: set "
                "store_url (or REDIS_URL) to a Redis URL"
            )
        return self

    @field_validator("store_url")
    @classmethod
    def _known_store_scheme(cls, value: str) -> str:
        schemes = ("memory://", "redis://", "rediss://", "redis+cluster://", "unix://")
        if not value.startswith(schemes):
            raise ValueError(f"store_url must start with one of {', '.join(schemes)}")
        if value.startswith(("redis://", "rediss://", "redis+cluster://")):
            parts = urlsplit(value)
            try:
                parts.port  # noqa: B018 (parsing it is the check)
            except ValueError:
                raise ValueError(
                    f"store_url {redacted_url(value)}: the port is not a number"
                ) from None
            if not parts.hostname:
                raise ValueError(f"store_url {redacted_url(value)} names no host")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment must win over it.
        return env_settings, init_settings

    @property
    def anthropic_route(self) -> Route:
        """Catch-all route for Anthropic-format requests whose model no route matches: the
        client's own credentials go with them."""
        return Route(
            model="*",
            base_url=self.anthropic_base_url,
            api_key_env=self.anthropic_api_key_env,
            account_endpoints=self.account_endpoints,
            native_compaction=self.native_compaction,
        )

    @property
    def default_route(self) -> Route:
        """Catch-all route for models that no configured route matches."""
        return Route(
            model="*",
            base_url=self.upstream_base_url,
            api_key_env=self.upstream_api_key_env,
            account_endpoints=self.account_endpoints,
            native_compaction=self.native_compaction,
        )


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """``COMPACTION_PROXY_*`` variables that name no setting (a typo is otherwise ignored)."""
    prefix = "COMPACTION_PROXY_"
    # Besides the settings: the config file's path, the admin CLI's proxy address, and the
    # secret a supervisor hands its workers.
    others = {CONFIG_PATH_ENV[len(prefix) :], "ADMIN_URL", LOOPBACK_SECRET_ENV[len(prefix) :]}
    known = {name.upper() for name in Settings.model_fields} | others
    unknown = []
    for name in environ:
        if name.startswith(prefix):
            setting = name[len(prefix) :].split("__", 1)[0]
            if setting not in known:
                unknown.append(name)
    return sorted(unknown)


def config_path_from_env() -> Path | None:
    explicit = os.environ.get(CONFIG_PATH_ENV)
    if explicit:
        return Path(explicit)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (or the default location) plus the environment.

    ``overrides`` win over the file but not over the environment; tests use them.
    Raises ConfigError naming every invalid key.
    """
    data: dict[str, Any] = {}
    text = ""
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
            loaded = yaml.safe_load(text)
        except OSError as exc:
            raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from exc
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            raise ConfigError(f"{where}: invalid YAML: {exc.problem or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"configuration {path} must be a mapping at the top level")
        data = loaded or {}
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as exc:
        aliases = {name: _aliases(field) for name, field in Settings.model_fields.items()}
        shown = str(path) if path is not None else None
        raise ConfigError(config_errors.describe(exc, shown, text, aliases, os.environ)) from exc


def _aliases(field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    return []


def redacted_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (for logs and reports)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def unversioned_upstreams(settings: Settings) -> list[str]:
    """Upstream base URLs with no version segment in their path (``/v1``, ``/v4``, ``/v1beta``):
    usually a forgotten ``/v1``, and the upstream then answers every request with a 404."""
    urls = [str(settings.upstream_base_url), *(str(r.base_url) for r in settings.routes)]
    return [u for u in dict.fromkeys(urls) if not _VERSION_SEGMENT.search(urlsplit(u).path)]


_VERSION_SEGMENT = re.compile(r"/v\d+[a-z0-9]*(/|$)")
