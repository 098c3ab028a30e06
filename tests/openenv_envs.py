"""An environment written for OpenEnv (openenv-core), as its users write one: raypost runs it
unchanged through ``agent.env: openenv`` (``raypost.agents.openenv_env``)."""

from __future__ import annotations

from openenv.core.env_server import Action, Environment, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    feedback: str = ""


class GuessNumber(Environment):
    """Guess a number in 1..hi: 'higher' / 'lower' after each wrong guess, reward 1 when right."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, hi: int = 10, secret: int = 7) -> None:
        super().__init__()
        self.hi, self.secret = hi, secret
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: object) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback=f"Guess my number, 1 to {self.hi}. Reply with the number only.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: object) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.secret:
            return GuessObservation(feedback="right", done=True, reward=1.0)
        return GuessObservation(feedback="higher" if action.guess < self.secret else "lower", reward=0.0)

    @property
    def state(self) -> State:
        return self._state
