//! The training facts kohya's `sd-scripts` (and tools built on it) write
//! into a LoRA file's safetensors header as `ss_*` strings.
//!
//! Why: a LoRA shared alone carries its run in its header: how many steps
//! and epochs it trained of how many, at which learning rates, on which
//! base model, with which network dim and alpha. A file that says
//! `ss_steps` 5 is a smoke test whatever its weights look like, so these
//! become the run's facts where no log sits beside the file.
//!
//! Every value is a string in the header (sd-scripts writes `str(x)`);
//! one that does not parse as the number it should be is left out, not an
//! error: the header is metadata, and the weights are judged either way.

/// What the `ss_*` entries say about the run (each None where absent or
/// not a number).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KohyaRun {
    /// Optimizer steps taken when the file was saved (`ss_steps`).
    pub steps: Option<i64>,
    /// Steps the run was set for (`ss_max_train_steps`).
    pub max_train_steps: Option<i64>,
    /// The epoch the file was saved at and the epochs planned
    /// (`ss_epoch`, `ss_num_epochs`).
    pub epoch: Option<i64>,
    pub num_epochs: Option<i64>,
    /// `ss_network_dim`, `ss_network_alpha` (LoRA's rank and alpha as set).
    pub network_dim: Option<f64>,
    pub network_alpha: Option<f64>,
    /// The settings as written (name less `ss_`, value), in the order of
    /// [`FACT_KEYS`], for the run's facts.
    pub settings: Vec<(String, String)>,
}

/// The `ss_*` keys shown as run settings, in this order.
pub const FACT_KEYS: [&str; 14] = [
    "ss_network_module",
    "ss_network_dim",
    "ss_network_alpha",
    "ss_steps",
    "ss_max_train_steps",
    "ss_epoch",
    "ss_num_epochs",
    "ss_learning_rate",
    "ss_unet_lr",
    "ss_text_encoder_lr",
    "ss_lr_scheduler",
    "ss_optimizer",
    "ss_sd_model_name",
    "ss_base_model_version",
];

/// Longest value kept as a setting (a model path, an optimizer's args).
const MAX_VALUE_CHARS: usize = 200;

impl KohyaRun {
    /// The run a header's metadata describes; None when it holds no
    /// `ss_*` entry at all.
    pub fn of(metadata: &[(String, String)]) -> Option<KohyaRun> {
        let get = |key: &str| {
            metadata
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.trim())
                .filter(|v| !v.is_empty() && *v != "None")
        };
        if !metadata.iter().any(|(k, _)| k.starts_with("ss_")) {
            return None;
        }
        let int = |key: &str| {
            get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .filter(|n| *n >= 0)
        };
        let float = |key: &str| {
            get(key)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|x| x.is_finite())
        };
        let settings = FACT_KEYS
            .iter()
            .filter_map(|key| {
                let value: String = get(key)?.chars().take(MAX_VALUE_CHARS).collect();
                Some((key.trim_start_matches("ss_").to_string(), value))
            })
            .collect();
        Some(KohyaRun {
            steps: int("ss_steps"),
            max_train_steps: int("ss_max_train_steps"),
            epoch: int("ss_epoch"),
            num_epochs: int("ss_num_epochs"),
            network_dim: float("ss_network_dim"),
            network_alpha: float("ss_network_alpha"),
            settings,
        })
    }

    /// Whether the file is a save from the middle of its run (an epoch
    /// save before the last epoch): its steps say where the save was, not
    /// where the run stopped.
    pub fn is_mid_run_save(&self) -> bool {
        match (self.epoch, self.num_epochs) {
            (Some(e), Some(n)) => e < n,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_header_strings_become_numbers_and_settings() {
        let run = KohyaRun::of(&meta(&[
            ("ss_steps", "5"),
            ("ss_max_train_steps", "1600"),
            ("ss_epoch", "1"),
            ("ss_num_epochs", "10"),
            ("ss_network_dim", "16"),
            ("ss_network_alpha", "8.0"),
            ("ss_unet_lr", "0.0001"),
            ("ss_text_encoder_lr", "None"),
            ("ss_sd_model_name", "sd_xl_base_1.0.safetensors"),
            ("format", "pt"),
        ]))
        .expect("ss_ keys");
        assert_eq!(run.steps, Some(5));
        assert_eq!(run.max_train_steps, Some(1600));
        assert_eq!(run.network_dim, Some(16.0));
        assert_eq!(run.network_alpha, Some(8.0));
        assert!(run.is_mid_run_save());
        let names: Vec<&str> = run.settings.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "network_dim",
                "network_alpha",
                "steps",
                "max_train_steps",
                "epoch",
                "num_epochs",
                "unet_lr",
                "sd_model_name"
            ]
        );
    }

    #[test]
    fn values_that_are_no_numbers_are_left_out_and_no_ss_keys_is_none() {
        let run = KohyaRun::of(&meta(&[("ss_steps", "five"), ("ss_network_dim", "nan")]))
            .expect("ss_ keys");
        assert_eq!(run.steps, None);
        assert_eq!(run.network_dim, None);
        assert!(!run.is_mid_run_save());
        assert_eq!(KohyaRun::of(&meta(&[("format", "pt")])), None);
        let long = "x".repeat(5000);
        let run = KohyaRun::of(&meta(&[("ss_sd_model_name", &long)])).expect("ss_ keys");
        assert_eq!(run.settings[0].1.len(), MAX_VALUE_CHARS);
    }
}
