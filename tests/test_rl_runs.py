"""RL runs judged by their reward, each written by its ecosystem's real
library (issue 52, items 1 and 2): Stable-Baselines3's TensorBoard logs
(``rollout/ep_rew_mean`` beside ``train/value_loss``) and a CleanRL-style
loop's (``charts/episodic_return`` through torch's ``SummaryWriter``, as
CleanRL's scripts write it). The reward is found by its meaning, not by a
list; the losses of an RL objective are shown, never judged "diverged".
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("tensorboard")

import adapterprobe as ap  # noqa: E402


def drift(root: Path) -> ap.Record:
    (record,) = list(ap.scan(root, probes=["training_drift"]))
    return record


def rules(record: ap.Record) -> set[str]:
    return {f["rule"] for f in record.evidence.get("findings", [])}


class NeverRewarded(gym.Env):
    """Ten-step episodes whose reward is always 0: a reward function that
    never fires."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 0.0, self.t >= 10, False, {}


def sb3_ppo(env, logdir: Path, steps: int, n_steps: int) -> None:
    sb3 = pytest.importorskip("stable_baselines3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = sb3.PPO(
            "MlpPolicy",
            env,
            n_steps=n_steps,
            batch_size=64,
            n_epochs=2,
            seed=0,
            device="cpu",
            tensorboard_log=str(logdir),
        )
        model.learn(total_timesteps=steps)


def test_an_sb3_ppo_run_is_judged_by_its_reward(tmp_path):
    """PPO on CartPole: the reward climbs while the value loss grows with
    the returns it predicts; the run is an RL run, judged by
    rollout/ep_rew_mean, and its loss is shown, not called diverged."""
    sb3_ppo("CartPole-v1", tmp_path, steps=2048, n_steps=256)
    record = drift(tmp_path)
    assert record.evidence["objective"] == "rl", record.message
    assert record.evidence["run_facts"]["objective"] == "rl"
    assert "judged by its reward" in record.message
    assert "diverged" not in rules(record)
    assert record.evidence.get("reward_sampled"), record.evidence.keys()
    assert record.verdict in ("pass", "warn"), record.message


def test_an_sb3_run_whose_reward_never_fires_fails(tmp_path):
    sb3_ppo(NeverRewarded(), tmp_path, steps=64 * 8, n_steps=64)
    record = drift(tmp_path)
    assert record.verdict == "fail", record.message
    assert "zero_reward" in rules(record), record.message


def test_a_cleanrl_style_run_is_judged_by_its_episodic_return(tmp_path):
    """REINFORCE on CartPole logged as CleanRL's scripts log (torch's
    SummaryWriter, charts/episodic_return per episode at the global step,
    losses/policy_loss per update): found by meaning, judged by reward."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    writer = SummaryWriter(str(tmp_path / "runs" / "CartPole-v1__reinforce__1"))
    global_step = 0
    for episode in range(40):
        obs, _ = env.reset(seed=episode)
        log_probs, rewards, done = [], [], False
        while not done:
            dist = torch.distributions.Categorical(logits=policy(torch.as_tensor(obs)))
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            obs, reward, terminated, truncated, _ = env.step(action.item())
            rewards.append(float(reward))
            done = terminated or truncated
            global_step += 1
        returns = torch.tensor([sum(rewards[i:]) for i in range(len(rewards))])
        loss = -(torch.stack(log_probs) * (returns - returns.mean())).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        writer.add_scalar("charts/episodic_return", sum(rewards), global_step)
        writer.add_scalar("losses/policy_loss", loss.item(), global_step)
    writer.close()
    record = drift(tmp_path)
    assert record.evidence["objective"] == "rl", record.message
    assert "diverged" not in rules(record)
    assert record.verdict in ("pass", "warn"), record.message
