//! What a logged series is, from its name: the training loss, a held-out
//! loss, or something else. Trainers and hand-written loops name the loss
//! freely (`train/nll_loss`, `loss_step`, `train_mse_step`, `Loss/train`,
//! `learn/Logloss`, `dev_loss`), so a fixed list of names misses real runs.
//! A name is split into words at any non-alphanumeric character and read by
//! its words:
//!
//! - a **loss word** (`loss`, `losses`, a word ending in `loss`, `nll`,
//!   `mse`, `mae`, `rmse`, `xent`, `bce`) makes it a loss;
//! - a **held-out word** (`eval`, `val`, `valid`, `validation`, `dev`,
//!   `test`, `holdout`) makes it a held-out loss;
//! - a **setting word** (`scale`, `scaler`, `weight`, `coef`, `lambda`,
//!   `beta`, `alpha`, `ratio`) makes it no loss at all: `loss_scale` is the
//!   mixed-precision scaler, `loss_weight` a coefficient.
//!
//! Among the candidates the plainest wins: a per-step series before an
//! epoch aggregate (`loss_step` before `loss_epoch`), then the fewest
//! qualifying words (`train_loss/loss` before `train_loss/recon_loss`),
//! then the shorter name, then the name. The readers try their exact
//! default names first, so runs read before keep their series.

/// What a name says the series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A loss on the training data.
    TrainLoss,
    /// A loss on held-out data (eval, validation, dev, test).
    HeldOutLoss,
    /// Anything else.
    Other,
}

const LOSS_WORDS: [&str; 7] = ["nll", "mse", "mae", "rmse", "xent", "bce", "losses"];
const HELD_OUT_WORDS: [&str; 10] = [
    "eval",
    "evaluation",
    "val",
    "valid",
    "validation",
    "dev",
    "test",
    "testing",
    "holdout",
    "heldout",
];
const SETTING_WORDS: [&str; 9] = [
    "scale", "scaler", "scaling", "weight", "coef", "lambda", "beta", "alpha", "ratio",
];
/// Words that say nothing beyond "the training loss".
const PLAIN_WORDS: [&str; 13] = [
    "train",
    "current", // kohya's loss/current: the step's own loss (loss/average is its moving mean)
    "training",
    "trn",
    "learn",
    "step",
    "steps",
    "iter",
    "total",
    "overall",
    "mean",
    "avg",
    "objective",
];

/// Longest name read as words; longer ones are no series we know.
const MAX_NAME: usize = 256;

fn words(name: &str) -> Vec<String> {
    name.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn is_loss_word(word: &str) -> bool {
    word.ends_with("loss") || LOSS_WORDS.contains(&word)
}

/// The role of the series called `name`.
pub fn role(name: &str) -> Role {
    if name.len() > MAX_NAME {
        return Role::Other;
    }
    let words = words(name);
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    if !words.iter().any(|w| is_loss_word(w)) || has(&SETTING_WORDS) {
        Role::Other
    } else if has(&HELD_OUT_WORDS) {
        Role::HeldOutLoss
    } else {
        Role::TrainLoss
    }
}

/// How plain a loss name is: lower sorts first.
fn plainness(name: &str) -> (bool, usize, usize) {
    let words = words(name);
    let epoch = words.iter().any(|w| w == "epoch" || w == "epochs");
    let qualifiers = words
        .iter()
        .filter(|w| {
            !is_loss_word(w)
                && !PLAIN_WORDS.contains(&w.as_str())
                && !HELD_OUT_WORDS.contains(&w.as_str())
                && *w != "epoch"
                && *w != "epochs"
        })
        .count();
    (epoch, qualifiers, name.len())
}

/// The plainest of `names` with the given role.
pub fn plainest<'a>(names: impl IntoIterator<Item = &'a str>, wanted: Role) -> Option<&'a str> {
    names
        .into_iter()
        .filter(|n| role(n) == wanted)
        .min_by(|a, b| plainness(a).cmp(&plainness(b)).then_with(|| a.cmp(b)))
}

/// The loss series to judge among `names`: the plainest training loss, or,
/// where none is logged, the plainest held-out loss (the bool says which).
pub fn choose_loss<'a>(
    names: impl IntoIterator<Item = &'a str> + Clone,
) -> Option<(&'a str, bool)> {
    plainest(names.clone(), Role::TrainLoss)
        .map(|n| (n, false))
        .or_else(|| plainest(names, Role::HeldOutLoss).map(|n| (n, true)))
}

/// The loss among `names` as a reader picks it: the first of its `usual`
/// names present, else [`choose_loss`]'s (training loss, else held-out).
pub fn loss_among<'a>(
    usual: &[&str],
    names: impl IntoIterator<Item = &'a str> + Clone,
) -> Option<&'a str> {
    usual
        .iter()
        .find_map(|u| names.clone().into_iter().find(|n| n == u))
        .or_else(|| choose_loss(names).map(|(name, _)| name))
}

/// Words that make a name a reward or a return (`rollout/ep_rew_mean`,
/// `charts/episodic_return`, `Rewards/mean_episodes`, `episode_reward_mean`).
const REWARD_WORDS: [&str; 5] = ["reward", "rewards", "rew", "return", "returns"];
/// Words that make a reward-named series something else: a preference
/// trainer's implicit rewards (`rewards/chosen`, `rewards/margins`), a
/// statistic other than the level, or a value estimate.
const NOT_REWARD_WORDS: [&str; 17] = [
    "chosen",
    "rejected",
    "margin",
    "margins",
    "accuracy",
    "accuracies",
    "std",
    "min",
    "max",
    "var",
    "value",
    "values",
    "advantage",
    "advantages",
    "model",
    "kl",
    "penalty",
];
/// Words that say a reward series is its mean.
const MEAN_WORDS: [&str; 3] = ["mean", "avg", "average"];

/// Whether `name` is an RL run's reward or return, read by its words (see
/// [`REWARD_WORDS`]; never a loss, a setting or a preference statistic).
pub fn is_reward(name: &str) -> bool {
    if name.len() > MAX_NAME {
        return false;
    }
    let words = words(name);
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    has(&REWARD_WORDS)
        && !has(&NOT_REWARD_WORDS)
        && !has(&SETTING_WORDS)
        && !words.iter().any(|w| is_loss_word(w))
}

/// The reward among `names` by meaning: a mean before any other, then the
/// fewest words, the shorter name, the name.
pub fn reward_among<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let rank = |name: &str| {
        let words = words(name);
        let mean = words.iter().any(|w| MEAN_WORDS.contains(&w.as_str()));
        (!mean, words.len(), name.len())
    };
    names
        .into_iter()
        .filter(|n| is_reward(n))
        .min_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_seen_in_the_field_are_training_losses() {
        for name in [
            "train/nll_loss",
            "train_loss_epoch",
            "loss_step",
            "train_mse_step",
            "train_loss/loss",
            "Loss/train",
            "epoch_loss",
            "learn/Logloss",
            "train/loss",
            "loss",
            "trainLoss",
        ] {
            assert_eq!(role(name), Role::TrainLoss, "{name}");
        }
    }

    #[test]
    fn held_out_losses_and_other_series_are_told_apart() {
        for name in [
            "dev_loss",
            "val_loss",
            "eval/loss",
            "val/rmse_loss",
            "test_MSE",
            "valid_loss_0",
        ] {
            assert_eq!(role(name), Role::HeldOutLoss, "{name}");
        }
        for name in [
            "loss_scale",
            "train/loss_scale",
            "kl_coef",
            "accuracy",
            "train_acc_step",
            "lr-AdamW",
            "grad_norm",
            "epoch",
            "step",
            "val_acc",
            "lossy_compression_level",
            "",
        ] {
            assert_eq!(role(name), Role::Other, "{name}");
        }
        assert_eq!(role(&"loss_".repeat(100)), Role::Other);
    }

    #[test]
    fn the_plainest_per_step_loss_wins() {
        let pick = |names: &[&'static str]| choose_loss(names.iter().copied());
        assert_eq!(
            pick(&["loss_epoch", "loss_step", "val_loss"]),
            Some(("loss_step", false))
        );
        assert_eq!(
            pick(&[
                "train_loss/recon_loss",
                "train_loss/vq_loss",
                "train_loss/loss"
            ]),
            Some(("train_loss/loss", false))
        );
        assert_eq!(
            pick(&["train_loss_epoch", "test_loss", "val_loss"]),
            Some(("train_loss_epoch", false))
        );
        assert_eq!(
            pick(&["train_gen_loss", "train_disc_loss"]),
            Some(("train_gen_loss", false))
        );
        // No training loss: the held-out one, said so.
        assert_eq!(
            pick(&["dev_auroc", "dev_loss", "epoch", "step"]),
            Some(("dev_loss", true))
        );
        assert_eq!(
            pick(&["epoch", "step", "val_loss"]),
            Some(("val_loss", true))
        );
        assert_eq!(pick(&["epoch", "step", "accuracy"]), None);
        assert_eq!(pick(&[]), None);
        // A reader's usual names come first, in its order.
        let names = ["train/nll_loss", "loss", "train_loss"];
        assert_eq!(
            loss_among(&["train_loss", "loss"], names),
            Some("train_loss")
        );
        assert_eq!(loss_among(&["train/loss"], names), Some("loss"));
        assert_eq!(
            loss_among(&["train/loss"], ["val_loss", "train/nll_loss"]),
            Some("train/nll_loss")
        );
        assert_eq!(loss_among(&["train/loss"], ["accuracy"]), None);
    }

    proptest::proptest! {
        /// Any names at all: no panic, and the choice is one of them with
        /// the role it claims.
        #[test]
        fn the_choice_is_always_one_of_the_names(names in proptest::collection::vec(".{0,40}", 0..12)) {
            let chosen = choose_loss(names.iter().map(String::as_str));
            if let Some((name, held_out)) = chosen {
                proptest::prop_assert!(names.iter().any(|n| n == name));
                let want = if held_out { Role::HeldOutLoss } else { Role::TrainLoss };
                proptest::prop_assert_eq!(role(name), want);
                if held_out {
                    proptest::prop_assert!(names.iter().all(|n| role(n) != Role::TrainLoss));
                }
            } else {
                proptest::prop_assert!(names.iter().all(|n| role(n) == Role::Other));
            }
        }
    }

    #[test]
    fn rewards_are_read_by_meaning_across_ecosystems() {
        for name in [
            "rollout/ep_rew_mean",
            "charts/episodic_return",
            "episode_reward_mean",
            "env_runners/episode_return_mean",
            "Rewards/mean_episodes",
            "train/reward",
            "objective/rlhf_reward",
        ] {
            assert!(is_reward(name), "{name}");
        }
        for name in [
            "rewards/chosen",
            "rewards/margins",
            "rewards/accuracies",
            "reward_std",
            "reward_model_loss",
            "loss/value",
            "Loss/v",
            "returns/value",
            "learning_rate",
        ] {
            assert!(!is_reward(name), "{name}");
        }
        let names = [
            "rollout/ep_rew_max",
            "rollout/ep_rew_mean",
            "episode_reward",
        ];
        assert_eq!(reward_among(names), Some("rollout/ep_rew_mean"));
        assert_eq!(
            reward_among(["charts/episodic_return", "x"]),
            Some("charts/episodic_return")
        );
        assert_eq!(reward_among(["rewards/chosen", "loss"]), None);
    }
}
