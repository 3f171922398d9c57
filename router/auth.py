"""Which agent a caller is.

Where any agent declares ``api_keys``, the caller must send ``Authorization: Bearer KEY`` and the
key picks the agent (compared in constant time). Where none does, the ``X-Agent`` header names
the agent, else a completion's ``model`` where it is an agent's name (:meth:`AgentResolver.settle`),
else ``gateway.default_agent``; an ``Authorization`` header is then ignored (the OpenAI SDK always
sends one).

Where ``gateway.admin_key`` is set, the operator endpoints need it the same way (:meth:`check_admin`).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from router.core.config import AgentConfig, Config
from router.core.errors import Unauthorized, shown


class AgentResolver:
    def __init__(self, config: Config) -> None:
        self._keys = tuple((k.encode(), a) for a in config.agents for k in a.api_keys)
        self._by_name = {a.name: a for a in config.agents}
        self._default = config.agent(config.gateway.default_agent) if config.gateway.default_agent else None
        self._served = frozenset(config.served_models)
        admin = config.gateway.admin_key
        self._admin = admin.encode() if admin else None

    def check_admin(self, headers: Mapping[str, str]) -> None:
        """The operator endpoints (/fleet, /metrics): open where no ``gateway.admin_key`` is set,
        else ``Authorization: Bearer <admin_key>`` (constant time). Raises Unauthorized (401)."""
        if self._admin is None:
            return
        scheme, _, token = headers.get("authorization", "").partition(" ")
        ok = hmac.compare_digest(token.strip().encode(), self._admin)
        if scheme.lower() != "bearer" or not ok:
            raise Unauthorized("this endpoint needs the gateway's admin key: send Authorization: Bearer ADMIN_KEY",
                               code="invalid_admin_key")  # fmt: skip

    def resolve(self, headers: Mapping[str, str]) -> AgentConfig:
        """The caller's agent. Raises Unauthorized (401) for no or an unknown key or agent."""
        agent = self.named(headers)
        if agent is not None:
            return agent
        if self._default is not None:
            return self._default
        raise Unauthorized("no agent: send an X-Agent header (no default_agent is configured)",
                           code="missing_agent")  # fmt: skip

    @property
    def default(self) -> AgentConfig | None:
        """``gateway.default_agent``'s agent, where one is set."""
        return self._default

    def named(self, headers: Mapping[str, str]) -> AgentConfig | None:
        """The agent the caller's key or ``X-Agent`` header names; None where it names none (no keys
        configured and no header). Raises Unauthorized (401) for no or an unknown key or agent."""
        if self._keys:
            return self._by_key(headers.get("authorization", ""))
        name = headers.get("x-agent", "").strip()
        if not name:
            return None
        agent = self._by_name.get(name)
        if agent is None:
            raise Unauthorized(f"unknown agent {shown(name)} in X-Agent", code="unknown_agent")
        return agent

    def settle(self, named: AgentConfig | None, model: str) -> AgentConfig:
        """A completion's agent: ``named`` (:meth:`named`), or, where the caller named none, the agent its
        ``model`` names ("let the router pick the model for this agent"), else ``default_agent``. A caller
        whose key or header names an agent stays that agent: another agent's name is then no model of its
        own (404, which does not tell that agent's existence), and a served model's name stays a model."""
        if named is not None:
            return named
        agent = self._by_name.get(model) if model not in self._served else None
        if agent is not None:
            return agent
        if self._default is not None:
            return self._default
        raise Unauthorized("no agent: send an X-Agent header or name an agent as the model (no default_agent "
                           "is configured)", code="missing_agent")  # fmt: skip

    def _by_key(self, authorization: str) -> AgentConfig:
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("missing API key: send Authorization: Bearer KEY")
        presented = token.encode()
        found: AgentConfig | None = None
        for key, agent in self._keys:  # every key is compared, so the time does not tell which matched
            if hmac.compare_digest(presented, key) and found is None:
                found = agent
        if found is None:
            raise Unauthorized("incorrect API key provided")
        return found
