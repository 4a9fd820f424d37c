"""FastAPI dependencies (Annotated aliases, full-stack-fastapi-template style)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlmodel import Session

from app.db.models import AgentSession
from app.scenario_catalog import ScenarioCatalog
from app.services import sessions as sessions_service
from app.services.turns import TurnService
from app.settings import WorkbenchSettings
from app.workbench import Workbench


def get_workbench(request: Request) -> Workbench:
    return request.app.state.workbench


WorkbenchDep = Annotated[Workbench, Depends(get_workbench)]


def get_settings(workbench: WorkbenchDep) -> WorkbenchSettings:
    return workbench.settings


def get_db(workbench: WorkbenchDep) -> Iterator[Session]:
    with Session(workbench.engine) as db:
        yield db


def get_catalog(workbench: WorkbenchDep) -> ScenarioCatalog:
    return workbench.catalog


def get_turn_service(workbench: WorkbenchDep) -> TurnService:
    return workbench.turns


SettingsDep = Annotated[WorkbenchSettings, Depends(get_settings)]
DbDep = Annotated[Session, Depends(get_db)]
CatalogDep = Annotated[ScenarioCatalog, Depends(get_catalog)]
TurnServiceDep = Annotated[TurnService, Depends(get_turn_service)]


def get_agent_session(session_id: str, db: DbDep) -> AgentSession:
    return sessions_service.get_session(db, session_id)


AgentSessionDep = Annotated[AgentSession, Depends(get_agent_session)]
