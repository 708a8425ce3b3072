//! Which tool wrote a LoRA safetensors file, told by its tensor names.
//!
//! Why: the LoRA files people share most are not PEFT saves. Image-model
//! LoRAs come from kohya's `sd-scripts` (`lora_unet_…`/`lora_te_…` keys,
//! `.lora_down.weight`, `.lora_up.weight`, `.alpha`) or LyCORIS (the same
//! LoRA keys, or LoHa's `hada_w1_a`… and LoKr's `lokr_w1`…), diffusers
//! saves PEFT's naming under a component prefix (`unet.…lora_A.weight`,
//! `transformer.…`), and `mlx-lm` saves `….lora_a`/`….lora_b` transposed.
//! One file has no config beside it, so its naming is all there is to say
//! what it is and how its factors are laid out.
//!
//! Only names are looked at here (a header's tensor list); the factors'
//! shapes are checked where they are read (`analysis::adapter_weights`).

use crate::formats::safetensors_header::Header;

/// The naming of a LoRA file's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraFormat {
    /// PEFT's `lora_A.weight`/`lora_B.weight` (also diffusers' saves, whose
    /// keys start with the component: `unet.`, `transformer.`,
    /// `text_encoder.`).
    Peft,
    /// kohya's `lora_down.weight`/`lora_up.weight`/`alpha` (sd-scripts and
    /// LyCORIS's LoRA/LoCon; also diffusers' older `lora.down.weight`).
    Kohya,
    /// LyCORIS LoHa: `hada_w1_a`, `hada_w1_b`, `hada_w2_a`, `hada_w2_b`
    /// (and `hada_t1`/`hada_t2` for a Tucker conv module).
    LoHa,
    /// LyCORIS LoKr: `lokr_w1` (or `lokr_w1_a`/`_b`), `lokr_w2` (or `_a`/`_b`),
    /// and `lokr_t2` for a Tucker conv module.
    LoKr,
    /// `mlx-lm`: `lora_a` (in × r) and `lora_b` (r × out).
    Mlx,
}

impl LoraFormat {
    /// The name records and messages use.
    pub fn name(self) -> &'static str {
        match self {
            LoraFormat::Peft => "peft",
            LoraFormat::Kohya => "kohya",
            LoraFormat::LoHa => "lycoris-loha",
            LoraFormat::LoKr => "lycoris-lokr",
            LoraFormat::Mlx => "mlx",
        }
    }

    /// The method as PEFT would name it (`peft_type`): `LORA`, `LOHA`, `LOKR`.
    pub fn method(self) -> &'static str {
        match self {
            LoraFormat::LoHa => "LOHA",
            LoraFormat::LoKr => "LOKR",
            _ => "LORA",
        }
    }
}

/// The part a tensor plays in a LoRA module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRole {
    /// The down projection (PEFT's `lora_A`, kohya's `lora_down`, MLX's `lora_a`).
    Down,
    /// The up projection (`lora_B`, `lora_up`, `lora_b`).
    Up,
    /// kohya's per-module `alpha` scalar (scale = alpha / rank).
    Alpha,
    /// A factor of another method (LoHa, LoKr, LoCon's `lora_mid`).
    Other,
}

/// Suffixes that name a LoRA tensor, with the format and role they say.
const SUFFIXES: [(&str, LoraFormat, KeyRole); 23] = [
    (".lora_A.weight", LoraFormat::Peft, KeyRole::Down),
    (".lora_B.weight", LoraFormat::Peft, KeyRole::Up),
    (".lora_down.weight", LoraFormat::Kohya, KeyRole::Down),
    (".lora_up.weight", LoraFormat::Kohya, KeyRole::Up),
    (".lora.down.weight", LoraFormat::Kohya, KeyRole::Down),
    (".lora.up.weight", LoraFormat::Kohya, KeyRole::Up),
    (".lora_mid.weight", LoraFormat::Kohya, KeyRole::Other),
    (".lora_a", LoraFormat::Mlx, KeyRole::Down),
    (".lora_b", LoraFormat::Mlx, KeyRole::Up),
    (".hada_w1_a", LoraFormat::LoHa, KeyRole::Other),
    (".hada_w1_b", LoraFormat::LoHa, KeyRole::Other),
    (".hada_w2_a", LoraFormat::LoHa, KeyRole::Other),
    (".hada_w2_b", LoraFormat::LoHa, KeyRole::Other),
    (".hada_t1", LoraFormat::LoHa, KeyRole::Other),
    (".hada_t2", LoraFormat::LoHa, KeyRole::Other),
    (".lokr_w1", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_w1_a", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_w1_b", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_w2", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_w2_a", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_w2_b", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_t1", LoraFormat::LoKr, KeyRole::Other),
    (".lokr_t2", LoraFormat::LoKr, KeyRole::Other),
];

/// kohya's and LyCORIS's per-module alpha.
const ALPHA_SUFFIX: &str = ".alpha";

/// (module, format, role) of a tensor name; None for a name no LoRA
/// format gives. `.alpha` alone says no format (PEFT files never hold one,
/// kohya's always beside its factors), so it is [`KeyRole::Alpha`] of
/// [`LoraFormat::Kohya`] only as a role.
pub fn classify(key: &str) -> Option<(&str, LoraFormat, KeyRole)> {
    if let Some(module) = key.strip_suffix(ALPHA_SUFFIX) {
        return (!module.is_empty()).then_some((module, LoraFormat::Kohya, KeyRole::Alpha));
    }
    SUFFIXES.iter().find_map(|&(suffix, format, role)| {
        let module = key.strip_suffix(suffix)?;
        (!module.is_empty()).then_some((module, format, role))
    })
}

/// The format of a file whose tensors are called `names`: LyCORIS's LoKr
/// or LoHa wherever one of their factors is (a LyCORIS file of LoHa
/// modules may hold plain LoRA ones too), else the format most of the
/// LoRA factors have; None when no name is a LoRA factor.
pub fn format_of<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<LoraFormat> {
    let mut counts = [0usize; 5];
    for name in names {
        if let Some((_, format, role)) = classify(name) {
            if role != KeyRole::Alpha {
                counts[format as usize] += 1;
            }
        }
    }
    if counts[LoraFormat::LoKr as usize] > 0 {
        return Some(LoraFormat::LoKr);
    }
    if counts[LoraFormat::LoHa as usize] > 0 {
        return Some(LoraFormat::LoHa);
    }
    [LoraFormat::Peft, LoraFormat::Kohya, LoraFormat::Mlx]
        .into_iter()
        .filter(|f| counts[*f as usize] > 0)
        .max_by_key(|f| counts[*f as usize])
}

/// The header metadata key diffusers keeps each component's PEFT config in.
pub const DIFFUSERS_METADATA: &str = "lora_adapter_metadata";
/// The components diffusers prefixes its LoRA keys with.
const DIFFUSERS_COMPONENTS: [&str; 6] = [
    "unet.",
    "transformer.",
    "text_encoder.",
    "text_encoder_2.",
    "text_encoder_3.",
    "prior.",
];

/// The format of a safetensors file read without a PEFT config, when it is
/// a LoRA file of another tool: kohya, LyCORIS or mlx-lm naming anywhere;
/// PEFT naming only as diffusers saves it (a component prefix, or its
/// config in the header), so a PEFT adapter that lost its config stays one.
pub fn file_format(header: &Header) -> Option<LoraFormat> {
    let format = format_of(header.tensors.iter().map(|t| t.name.as_str()))?;
    if format != LoraFormat::Peft {
        return Some(format);
    }
    let has_metadata = header
        .metadata
        .as_ref()
        .is_some_and(|m| m.iter().any(|(k, _)| k == DIFFUSERS_METADATA));
    let prefixed = header
        .tensors
        .iter()
        .any(|t| DIFFUSERS_COMPONENTS.iter().any(|p| t.name.starts_with(p)));
    (has_metadata || prefixed).then_some(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tools_names_say_its_format_and_role() {
        let cases = [
            (
                "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight",
                "lora_unet_down_blocks_0_attentions_0_proj_in",
                LoraFormat::Kohya,
                KeyRole::Down,
            ),
            (
                "lora_te_x.lora_up.weight",
                "lora_te_x",
                LoraFormat::Kohya,
                KeyRole::Up,
            ),
            (
                "lora_te_x.alpha",
                "lora_te_x",
                LoraFormat::Kohya,
                KeyRole::Alpha,
            ),
            (
                "unet.down_blocks.0.to_q.lora_A.weight",
                "unet.down_blocks.0.to_q",
                LoraFormat::Peft,
                KeyRole::Down,
            ),
            (
                "model.layers.0.self_attn.q_proj.lora_b",
                "model.layers.0.self_attn.q_proj",
                LoraFormat::Mlx,
                KeyRole::Up,
            ),
            (
                "lycoris_fc.hada_w2_b",
                "lycoris_fc",
                LoraFormat::LoHa,
                KeyRole::Other,
            ),
            (
                "lycoris_fc.lokr_w1",
                "lycoris_fc",
                LoraFormat::LoKr,
                KeyRole::Other,
            ),
        ];
        for (key, module, format, role) in cases {
            assert_eq!(classify(key), Some((module, format, role)), "{key}");
        }
        assert_eq!(classify("model.embed_tokens.weight"), None);
        assert_eq!(classify(".alpha"), None);
        assert_eq!(classify(".lora_A.weight"), None);
    }

    #[test]
    fn a_file_is_the_format_of_its_factors() {
        let kohya = ["a.lora_down.weight", "a.lora_up.weight", "a.alpha"];
        assert_eq!(format_of(kohya), Some(LoraFormat::Kohya));
        let loha = [
            "a.hada_w1_a",
            "a.alpha",
            "b.lora_down.weight",
            "b.lora_up.weight",
        ];
        assert_eq!(format_of(loha), Some(LoraFormat::LoHa));
        assert_eq!(
            format_of(["a.lokr_w1", "a.lokr_w2"]),
            Some(LoraFormat::LoKr)
        );
        assert_eq!(format_of(["x.lora_a", "x.lora_b"]), Some(LoraFormat::Mlx));
        assert_eq!(format_of(["a.alpha", "w.weight"]), None);
        assert_eq!(format_of(std::iter::empty()), None);
    }

    fn header(names: &[&str], metadata: Option<&str>) -> Header {
        Header {
            tensors: names
                .iter()
                .map(|n| crate::formats::safetensors_header::TensorInfo {
                    name: n.to_string(),
                    dtype: "F32".into(),
                    shape: vec![1],
                    data_offsets: (0, 4),
                })
                .collect(),
            metadata: metadata.map(|m| vec![(DIFFUSERS_METADATA.to_string(), m.to_string())]),
            data_len: 4,
        }
    }

    #[test]
    fn peft_naming_is_a_file_of_its_own_only_as_diffusers_saves_it() {
        let peft = [
            "base_model.model.q.lora_A.weight",
            "base_model.model.q.lora_B.weight",
        ];
        assert_eq!(file_format(&header(&peft, None)), None);
        assert_eq!(
            file_format(&header(&peft, Some("{}"))),
            Some(LoraFormat::Peft)
        );
        let unet = ["unet.a.to_q.lora_A.weight", "unet.a.to_q.lora_B.weight"];
        assert_eq!(file_format(&header(&unet, None)), Some(LoraFormat::Peft));
        let kohya = ["lora_te_x.lora_down.weight", "lora_te_x.lora_up.weight"];
        assert_eq!(file_format(&header(&kohya, None)), Some(LoraFormat::Kohya));
        assert_eq!(file_format(&header(&["model.embed.weight"], None)), None);
    }
}
