//! The family table: one row per architecture this engine runs, and everything that differs
//! between families besides the numbers of `config.json` (the `model_type` it reads, its
//! config parser, how its layers and MTP head load, its chat template and tool-call syntax).
//! The rest of the engine asks the row ([`Family::spec`]), never `match family`, so a new
//! family is a new row, its parser (a file beside this one) and whatever its layers compute
//! that no row has yet.

use super::{
    deepseek, deepseek_v4, glm4, glm5, gpt_oss, minimax, qwen3, qwen35, ConfigError, Keys,
    ModelConfig,
};
use crate::engine::chat::ChatTemplate;

/// The architectures this engine runs, by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// GLM-5: MLA attention with the DSA indexer, sigmoid router with correction bias.
    GlmMoeDsa,
    /// Qwen3-MoE: grouped-query attention with per-head q/k RMSNorm, softmax router.
    Qwen3Moe,
    /// GLM-4.5/4.6/4.7: grouped-query attention with biased projections and partial rotary,
    /// sigmoid router with correction bias, shared expert.
    Glm4Moe,
    /// DeepSeek-V3/R1/V3.1 and Kimi K2: GLM-5's MLA without the indexer, group-limited
    /// sigmoid router, YaRN.
    DeepseekV3,
    /// DeepSeek-V3.2: DeepSeek-V3 plus the DSA indexer on every layer (rotate-half rotary in
    /// the indexer, where GLM-5's is interleaved).
    DeepseekV32,
    /// MiniMax-M2 / M2.1 / M2.5 / M2.7: grouped-query attention with q/k RMSNorm over the whole
    /// projection and partial rotary, sigmoid router with correction bias, no shared expert.
    MiniMaxM2,
    /// gpt-oss: grouped-query attention with biases, sinks and alternating sliding windows,
    /// a biased router softmaxed over its top k, biased experts with a clamped SwiGLU.
    GptOss,
    /// Qwen3.5-MoE / Qwen3.6: Gated DeltaNet layers beside gated grouped-query attention,
    /// softmax router, a shared expert behind a sigmoid gate.
    Qwen35Moe,
    /// DeepSeek-V4: one shared key=value head over a sliding window plus compressed entries
    /// (CSA, HCA), grouped low-rank output, hyper-connections, hash-routed and sqrt-softplus
    /// routed experts with the clamped SwiGLU.
    DeepseekV4,
}

/// Which loader builds a family's decoder layers (the main ones and the MTP head's): the
/// model matches on it in one place, `layer::load`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// MLA attention, with the DSA indexer where the config has one (`layer.rs`).
    Mla,
    /// Grouped-query attention (`gqa_moe.rs`).
    Gqa,
    /// gpt-oss's grouped-query layer with sinks and biased experts (`gpt_oss.rs`).
    GptOss,
    /// Gated DeltaNet and gated grouped-query attention, by `layer_types` (`qwen35.rs`).
    Hybrid,
    /// DeepSeek-V4's layers (`dsv4_*.rs`).
    Dsv4,
}

/// The syntax in which a family's models write a tool call (what its chat template teaches
/// and renders; the API's parse of an `auto` call reads all of them, whatever the family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`.
    GlmXml,
    /// Hermes: `<tool_call>{"name": .., "arguments": ..}</tool_call>`.
    Hermes,
    /// `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜>`.
    DeepSeek,
    /// `<minimax:tool_call>\n<invoke name="..">\n<parameter name="k">v</parameter>\n</invoke>\n</minimax:tool_call>`.
    MiniMaxXml,
    /// gpt-oss's harmony: `<|start|>assistant to=functions.name<|channel|>commentary json
    /// <|message|>{..}` (the model writes `<|channel|>commentary to=functions.name
    /// <|constrain|>json<|message|>{..}<|call|>`).
    Harmony,
    /// Qwen3-Coder / Qwen3.5: `<tool_call>\n<function=name>\n<parameter=k>\nv\n</parameter>
    /// \n</function>\n</tool_call>`.
    QwenXml,
    /// DeepSeek-V4's DSML: `\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter
    /// name="k" string="true">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>`
    /// (`string="false"`: the value is JSON).
    Dsml,
}

/// One row of the table.
pub struct FamilySpec {
    pub family: Family,
    /// The `model_type` values of config.json that select this family; the first is its name.
    pub model_types: &'static [&'static str],
    /// The family's config parser (the common keys through `common::parse`, then its own).
    pub(super) parse: fn(&Keys<'_>) -> Result<ModelConfig, ConfigError>,
    /// The loader of its decoder layers and of its MTP head's layer.
    pub layers: LayerKind,
    /// Whether `attention_bias` biases o_proj too (Qwen3MoeAttention), not only q/k/v
    /// (Glm4MoeAttention's o_proj has bias=False; MLA biases its own projections).
    pub o_proj_bias: bool,
    /// The config key that makes a layer dense or sparse, as a load error names it:
    /// transformers' DeepseekV3 reads only first_k_dense_replace; the others read
    /// mlp_layer_types first.
    pub dense_layer_keys: &'static str,
    pub chat_template: ChatTemplate,
    pub tool_syntax: ToolSyntax,
}

const MLP_LAYER_TYPES: &str = "\"mlp_layer_types\" (or \"first_k_dense_replace\" without it)";

/// In the order an unknown `model_type` lists them.
static TABLE: [FamilySpec; 9] = [
    FamilySpec {
        family: Family::GlmMoeDsa,
        model_types: &["glm_moe_dsa"],
        parse: glm5::parse,
        layers: LayerKind::Mla,
        o_proj_bias: true,
        dense_layer_keys: MLP_LAYER_TYPES,
        chat_template: ChatTemplate::Glm,
        tool_syntax: ToolSyntax::GlmXml,
    },
    FamilySpec {
        family: Family::DeepseekV32,
        model_types: &["deepseek_v32"],
        parse: deepseek::parse_v32,
        layers: LayerKind::Mla,
        o_proj_bias: true,
        dense_layer_keys: MLP_LAYER_TYPES,
        chat_template: ChatTemplate::DeepSeek,
        tool_syntax: ToolSyntax::DeepSeek,
    },
    FamilySpec {
        family: Family::DeepseekV3,
        model_types: &["deepseek_v3"],
        parse: deepseek::parse,
        layers: LayerKind::Mla,
        o_proj_bias: true,
        dense_layer_keys: "\"first_k_dense_replace\"",
        chat_template: ChatTemplate::DeepSeek,
        tool_syntax: ToolSyntax::DeepSeek,
    },
    FamilySpec {
        family: Family::Glm4Moe,
        model_types: &["glm4_moe"],
        parse: glm4::parse,
        layers: LayerKind::Gqa,
        o_proj_bias: false,
        dense_layer_keys: MLP_LAYER_TYPES,
        chat_template: ChatTemplate::Glm4,
        tool_syntax: ToolSyntax::GlmXml,
    },
    FamilySpec {
        family: Family::Qwen3Moe,
        model_types: &["qwen3_moe"],
        parse: qwen3::parse,
        layers: LayerKind::Gqa,
        o_proj_bias: true,
        dense_layer_keys: MLP_LAYER_TYPES,
        chat_template: ChatTemplate::ChatMl,
        tool_syntax: ToolSyntax::Hermes,
    },
    FamilySpec {
        family: Family::MiniMaxM2,
        model_types: &["minimax_m2"],
        parse: minimax::parse,
        layers: LayerKind::Gqa,
        // No projection of this family has a bias (the parser sets attention_bias false).
        o_proj_bias: false,
        // No key makes a layer dense: the family itself makes every layer sparse.
        dense_layer_keys: "\"model_type\" minimax_m2 (every layer a mixture of experts)",
        chat_template: ChatTemplate::MiniMax,
        tool_syntax: ToolSyntax::MiniMaxXml,
    },
    FamilySpec {
        family: Family::GptOss,
        model_types: &["gpt_oss"],
        parse: gpt_oss::parse,
        layers: LayerKind::GptOss,
        o_proj_bias: true,
        dense_layer_keys: "(none: every gpt-oss layer is a mixture of experts)",
        chat_template: ChatTemplate::Harmony,
        tool_syntax: ToolSyntax::Harmony,
    },
    FamilySpec {
        family: Family::Qwen35Moe,
        model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
        parse: qwen35::parse,
        layers: LayerKind::Hybrid,
        o_proj_bias: true,
        dense_layer_keys: "(none: every layer is sparse)",
        chat_template: ChatTemplate::Qwen35,
        tool_syntax: ToolSyntax::QwenXml,
    },
    FamilySpec {
        family: Family::DeepseekV4,
        model_types: &["deepseek_v4"],
        parse: deepseek_v4::parse,
        layers: LayerKind::Dsv4,
        o_proj_bias: false,
        dense_layer_keys: "(none: every DeepSeek-V4 layer is a mixture of experts)",
        chat_template: ChatTemplate::DeepSeekV4,
        tool_syntax: ToolSyntax::Dsml,
    },
];

impl Family {
    pub const ALL: [Family; 9] = [
        Family::GlmMoeDsa,
        Family::DeepseekV32,
        Family::DeepseekV3,
        Family::Glm4Moe,
        Family::Qwen3Moe,
        Family::MiniMaxM2,
        Family::GptOss,
        Family::Qwen35Moe,
        Family::DeepseekV4,
    ];

    /// The family's row of the table.
    pub fn spec(self) -> &'static FamilySpec {
        // The one match on the family: the row of each.
        let i = match self {
            Family::GlmMoeDsa => 0,
            Family::DeepseekV32 => 1,
            Family::DeepseekV3 => 2,
            Family::Glm4Moe => 3,
            Family::Qwen3Moe => 4,
            Family::MiniMaxM2 => 5,
            Family::GptOss => 6,
            Family::Qwen35Moe => 7,
            Family::DeepseekV4 => 8,
        };
        &TABLE[i]
    }

    /// The `model_type` in config.json.
    pub fn model_type(self) -> &'static str {
        self.spec().model_types[0]
    }

    pub fn from_model_type(s: &str) -> Option<Family> {
        TABLE
            .iter()
            .find(|row| row.model_types.contains(&s))
            .map(|row| row.family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conversation::{render_calls, ToolCall};

    #[test]
    fn every_family_has_its_own_row_in_the_listed_order() {
        for (i, f) in Family::ALL.into_iter().enumerate() {
            assert_eq!(f.spec().family, f);
            assert!(std::ptr::eq(f.spec(), &TABLE[i]));
            assert_eq!(Family::from_model_type(f.model_type()), Some(f));
        }
        assert_eq!(Family::from_model_type("llama"), None);
    }

    #[test]
    fn each_template_writes_calls_in_its_rows_syntax() {
        let calls = [ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        }];
        for f in Family::ALL {
            let row = f.spec();
            let text = render_calls(row.chat_template, &calls);
            let opening = match row.tool_syntax {
                ToolSyntax::GlmXml => "<tool_call>get_weather\n<arg_key>",
                ToolSyntax::Hermes => "<tool_call>\n{\"name\"",
                ToolSyntax::DeepSeek => "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather",
                ToolSyntax::MiniMaxXml => "<minimax:tool_call>\n<invoke name=\"get_weather\">\n",
                ToolSyntax::Harmony => "<|start|>assistant to=functions.get_weather<|channel|>",
                ToolSyntax::QwenXml => "<tool_call>\n<function=get_weather>\n<parameter=city>",
                ToolSyntax::Dsml => {
                    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                }
            };
            assert!(text.starts_with(opening), "{f:?}: {text}");
            assert!(text.contains("Paris"), "{f:?}: {text}");
        }
    }
}
