//! `[model]` validation: each rule names the key and what is allowed; derived widths.

use ember_formats::config::{AttentionKernel, AttentionKind, FfnKind, ModelConfig, PositionKind};

fn baby() -> ModelConfig {
    ModelConfig::gpt(65, 4, 4, 128, 64)
}

#[test]
fn width_must_split_into_heads() {
    let bad = ModelConfig { d_model: 130, ..baby() };
    let err = bad.validate().unwrap_err();
    assert_eq!(err.to_string(), "model.d_model = 130: must be a multiple of model.n_heads = 4 (or set model.head_dim)");
    assert!(baby().validate().is_ok());
}

#[test]
fn dropout_must_be_a_probability() {
    let err = ModelConfig { dropout: 1.0, ..baby() }.validate().unwrap_err();
    assert_eq!(err.key, "model.dropout");
}

#[test]
fn kv_heads_must_divide_query_heads() {
    let err = ModelConfig { n_kv_heads: Some(3), ..baby() }.validate().unwrap_err();
    assert_eq!(err.to_string(), "model.n_kv_heads = 3: must divide model.n_heads = 4");
    assert!(ModelConfig { n_kv_heads: Some(1), ..baby() }.validate().is_ok());
}

#[test]
fn feature_map_attention_names_what_it_cannot_do() {
    let linear = ModelConfig { attention_kernel: AttentionKernel::Linear, ..baby() };
    assert!(linear.validate().is_ok());
    let windowed = ModelConfig { window: Some(8), ..linear.clone() };
    assert_eq!(
        windowed.validate().unwrap_err().to_string(),
        "model.attention_kernel = \"linear\": has no sliding window (softmax has it)"
    );
    let stray = ModelConfig { favor_features: Some(16), ..linear.clone() };
    assert_eq!(stray.validate().unwrap_err().key, "model.favor_features");
    let stray = ModelConfig { favor_redraw: Some(100), ..linear.clone() };
    assert_eq!(stray.validate().unwrap_err().key, "model.favor_redraw");
    let parsed: ModelConfig = toml::from_str(
        "n_layers = 1\nn_heads = 2\nd_model = 8\nblock_size = 4\nattention_kernel = \"favor\"\nfavor_features = 8",
    )
    .unwrap();
    assert_eq!((parsed.attention_kernel, parsed.favor_features), (AttentionKernel::Favor, Some(8)));
}

#[test]
fn mla_needs_its_widths_and_any_positions_do() {
    let mla = ModelConfig { attention: AttentionKind::Mla, positions: PositionKind::Rope, ..baby() };
    assert_eq!(mla.validate().unwrap_err().key, "model.mla_latent_dim");
    let mla = ModelConfig { mla_latent_dim: Some(32), mla_rope_dim: Some(8), ..mla };
    assert!(mla.validate().is_ok());
    // A GPT converted to MLA keeps its learned positions beside the decoupled RoPE key.
    assert!(ModelConfig { positions: PositionKind::Learned, ..mla.clone() }.validate().is_ok());
    assert_eq!(ModelConfig { mla_rope_dim: Some(3), ..mla }.validate().unwrap_err().key, "model.mla_rope_dim");
}

#[test]
fn swiglu_width_is_eight_thirds_rounded_to_64() {
    let c = ModelConfig { ffn: FfnKind::Swiglu, d_model: 576, ..baby() };
    assert_eq!(c.ffn_dim(), 1536);
    assert_eq!(ModelConfig { ffn: FfnKind::Swiglu, ..baby() }.ffn_dim(), 384);
}

/// Sizes are bounded, so that nothing derived from them (the FFN width, parameter counts, state sizes) overflows.
#[test]
fn sizes_past_their_bounds_are_refused() {
    let err = ModelConfig { d_model: 1 << 62, n_heads: 1, ..baby() }.validate().unwrap_err();
    assert_eq!(err.to_string(), "model.d_model = 4611686018427387904: at most 1048576");
    let favor = ModelConfig { favor_features: Some(i64::MAX as usize), ..baby() };
    let favor = ModelConfig { attention_kernel: AttentionKernel::Favor, ..favor };
    assert_eq!(favor.validate().unwrap_err().key, "model.favor_features");
    assert!(ModelConfig { n_layers: 1 << 16, ..baby() }.validate().is_ok());
}

/// `[model.rope_scaling]` in a run config: the kind and its keys, each checked; an unknown key is refused.
#[test]
fn rope_scaling_is_read_from_toml_and_checked() {
    use ember_formats::rope::RopeScaling;
    let table = |scaling: &str| {
        format!(
            "vocab_size = 65\nn_layers = 1\nn_heads = 2\nd_model = 16\nblock_size = 32\npositions = \"rope\"\n[rope_scaling]\n{scaling}"
        )
    };
    let config: ModelConfig = toml::from_str(&table("kind = \"linear\"\nfactor = 4.0")).unwrap();
    assert_eq!(config.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));
    let llama3 =
        "kind = \"llama3\"\nfactor = 8.0\nlow_freq_factor = 1.0\nhigh_freq_factor = 4.0\noriginal_context = 8192";
    let config: ModelConfig = toml::from_str(&table(llama3)).unwrap();
    assert!(config.validate().is_ok());
    let err = ModelConfig { rope_scaling: Some(RopeScaling::Linear { factor: f64::NAN }), ..config.clone() };
    assert_eq!(err.validate().unwrap_err().key, "model.rope_scaling.factor");
    assert!(toml::from_str::<ModelConfig>(&table("kind = \"linear\"\nfactor = 4.0\nbeta = 1.0")).is_err());
    assert!(toml::from_str::<ModelConfig>(&table("kind = \"longrope\"\nfactor = 4.0")).is_err());
    let yarn = "kind = \"yarn\"\nfactor = 4.0\noriginal_context = 4096\nbeta_fast = 32.0\nbeta_slow = 1.0\nattention_factor = 1.1";
    let config: ModelConfig = toml::from_str(&table(yarn)).unwrap();
    assert!(config.validate().is_ok());
    let slow =
        RopeScaling::Yarn { factor: 4.0, original_context: 16, beta_fast: 1.0, beta_slow: 2.0, attention_factor: 1.1 };
    let err = ModelConfig { rope_scaling: Some(slow), ..config }.validate().unwrap_err();
    assert_eq!(err.key, "model.rope_scaling.beta_fast");
}
