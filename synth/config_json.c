/* config_json.c — config.json and tokenizer_config.json of a synthetic model.
 *
 * Owns: every key of k3.md §1 with the values of synth_config; keys whose
 * value does not depend on the preset keep K3's value.  Uses jansson
 * directly (inside this component only) for real-number formatting that
 * people can read: 1e-05, not 1.0000000000000001e-05.  Does not own the
 * tensor layout (tensors.c).
 */
#include "synth/synth_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* K3's special-token offsets from the vocabulary base (k3.md §4/§6). */
enum { SP_BOS = 0, SP_EOS = 1, SP_END_OF_MSG = 2, SP_MEDIA_PAD = 21 };

static json_t *int_list(const synth_config *c, int want_mla)
{
    json_t *a = json_array();
    for (int i = 0; i < c->layers; i++)
        if (!!c->is_mla[i] == want_mla)
            json_array_append_new(a, json_integer(i + 1));
    return a;
}

static json_t *quantization_config(void)
{
    json_t *w = json_object(), *g = json_object(), *groups = json_object();
    json_t *q = json_object(), *ign = json_array(), *targets = json_array();
    static const char *const ignore[] = {
        "lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\..*",
        "re:.*block_sparse_moe\\.gate$", "re:.*routed_expert_(down|up)_proj$",
        "re:vision_tower.*", "re:mm_projector.*",
    };

    json_object_set_new(w, "num_bits", json_integer(4));
    json_object_set_new(w, "group_size", json_integer(32));
    json_object_set_new(w, "type", json_string("float"));
    json_object_set_new(w, "strategy", json_string("group"));
    json_object_set_new(w, "symmetric", json_true());
    json_object_set_new(w, "dynamic", json_false());
    json_object_set_new(w, "observer", json_string("minmax"));
    json_object_set_new(w, "scale_dtype", json_string("torch.uint8"));
    json_array_append_new(targets, json_string("Linear"));
    json_object_set_new(g, "format", json_string("mxfp4-pack-quantized"));
    json_object_set_new(g, "targets", targets);
    json_object_set_new(g, "weights", w);
    json_object_set_new(groups, "group_0", g);
    for (size_t i = 0; i < sizeof ignore / sizeof ignore[0]; i++)
        json_array_append_new(ign, json_string(ignore[i]));
    json_object_set_new(q, "quant_method", json_string("compressed-tensors"));
    json_object_set_new(q, "format", json_string("mxfp4-pack-quantized"));
    json_object_set_new(q, "quantization_status", json_string("compressed"));
    json_object_set_new(q, "config_groups", groups);
    json_object_set_new(q, "ignore", ign);
    return q;
}

static void token_ids(json_t *o, const synth_config *c)
{
    int base = c->vocab - SYNTH_SPECIALS;
    json_object_set_new(o, "bos_token_id", json_integer(base + SP_BOS));
    json_object_set_new(o, "eos_token_id", json_integer(base + SP_END_OF_MSG));
    json_object_set_new(o, "pad_token_id", json_integer(c->vocab - 1));
}

#define SETI(o, k, v) json_object_set_new(o, k, json_integer(v))
#define SETR(o, k, v) json_object_set_new(o, k, json_real(v))
#define SETS(o, k, v) json_object_set_new(o, k, json_string(v))
#define SETB(o, k, v) json_object_set_new(o, k, json_boolean(v))

static json_t *text_config(const synth_config *c)
{
    json_t *t = json_object(), *la = json_object();

    SETS(t, "model_type", "kimi_linear");
    SETS(t, "dtype", "bfloat16");
    SETS(t, "hidden_act", "situ");
    SETI(t, "hidden_size", c->hidden);
    SETI(t, "vocab_size", c->vocab);
    SETI(t, "max_position_embeddings", c->max_pos);
    SETI(t, "num_hidden_layers", c->layers);
    SETI(t, "first_k_dense_replace", 1);
    SETI(t, "moe_layer_freq", 1);
    SETI(t, "intermediate_size", c->dense_inter);
    SETI(t, "num_experts", c->experts);
    SETI(t, "num_experts_per_token", c->topk);
    SETI(t, "num_shared_experts", c->shared_experts);
    SETI(t, "moe_intermediate_size", c->moe_inter);
    SETI(t, "routed_expert_hidden_size", c->latent);
    SETS(t, "moe_router_activation_func", "sigmoid");
    SETS(t, "topk_method", "noaux_tc");
    SETB(t, "use_grouped_topk", 1);
    SETI(t, "num_expert_group", 1);
    SETI(t, "topk_group", 1);
    SETB(t, "moe_renormalize", 1);
    SETR(t, "routed_scaling_factor", 1.0);
    SETB(t, "latent_moe_use_norm", 1);
    SETR(t, "activation_situ_beta", 4.0);
    SETR(t, "activation_situ_linear_beta", 25.0);
    SETI(t, "num_attention_heads", c->mla_heads);
    SETI(t, "num_key_value_heads", c->mla_heads);
    SETI(t, "q_lora_rank", c->q_lora);
    SETI(t, "kv_lora_rank", c->kv_lora);
    SETI(t, "qk_nope_head_dim", c->qk_nope);
    SETI(t, "qk_rope_head_dim", c->qk_rope);
    SETI(t, "v_head_dim", c->v_head);
    SETB(t, "mla_use_nope", 1);
    SETB(t, "mla_use_output_gate", 1);
    SETI(t, "attn_res_block_size", c->attn_res_block);
    SETR(t, "rms_norm_eps", 1e-5);
    SETI(t, "num_nextn_predict_layers", 0);
    SETB(t, "use_cache", 1);
    SETB(t, "tie_word_embeddings", 0);
    token_ids(t, c);
    SETI(la, "num_heads", c->kda_heads);
    SETI(la, "head_dim", c->kda_head_dim);
    SETI(la, "short_conv_kernel_size", c->conv_kernel);
    SETR(la, "gate_lower_bound", -5.0);
    SETB(la, "use_full_rank_gate", 1);
    json_object_set_new(la, "kda_layers", int_list(c, 0));
    json_object_set_new(la, "full_attn_layers", int_list(c, 1));
    json_object_set_new(t, "linear_attn_config", la);
    json_object_set_new(t, "quantization_config", quantization_config());
    return t;
}

/* Serialise into out with a final newline; takes ownership of j. */
static int json_render(json_t *j, shoal_buf *out, const char *file, shoal_err *err)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) : NULL;
    int rc;

    json_decref(j);
    if (!text)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory rendering %s", file);
    rc = shoal_buf_append_str(out, text);
    rc = rc ? rc : shoal_buf_append_u8(out, '\n');   /* json_dumps leaves none */
    free(text);
    return rc ? shoal_err_set(err, rc, "out of memory rendering %s", file) : 0;
}

/* What the oracle preset promises (docs/mkmodel.md "The oracle"): a checker
 * reads the prompt and the continuation from here. */
static json_t *oracle_json(void)
{
    json_t *o = json_object(), *pi = json_array(), *ti = json_array();

    for (int i = 0; i < SYNTH_ORACLE_PROMPT_TOKENS; i++)
        json_array_append_new(pi, json_integer(synth_oracle_prompt_ids[i]));
    for (int i = 0; i < SYNTH_ORACLE_TEXT_TOKENS; i++)
        json_array_append_new(ti, json_integer(synth_oracle_text_ids[i]));
    SETS(o, "prompt", SYNTH_ORACLE_PROMPT);
    SETS(o, "text", SYNTH_ORACLE_TEXT);
    json_object_set_new(o, "prompt_ids", pi);
    json_object_set_new(o, "ids", ti);
    return o;
}

/* Present so loaders see K3's shape; a text engine ignores it.  The k3
 * preset describes the tensors vision.c makes. */
static json_t *vision_config(const synth_config *c)
{
    json_t *v = json_object(), *merge;

    SETS(v, "model_type", "kimi_k3_vision");
    if (!c->vision) {
        SETI(v, "hidden_size", 64);
        SETI(v, "num_hidden_layers", 1);
        SETI(v, "patch_size", 14);
        return v;
    }
    merge = json_array();
    json_array_append_new(merge, json_integer(2));
    json_array_append_new(merge, json_integer(2));
    SETI(v, "hidden_size", 1152);
    SETI(v, "intermediate_size", 4304);
    SETI(v, "num_hidden_layers", 13);
    SETI(v, "num_attention_heads", 16);
    SETI(v, "patch_size", 14);
    json_object_set_new(v, "merge_kernel_size", merge);
    return v;
}

int synth_config_render(const synth_config *c, shoal_buf *out, shoal_err *err)
{
    json_t *root = json_object(), *arch = json_array();

    json_array_append_new(arch, json_string("KimiK3ForConditionalGeneration"));
    json_object_set_new(root, "architectures", arch);
    SETS(root, "model_type", "kimi_k3");
    SETS(root, "dtype", "bfloat16");
    SETB(root, "tie_word_embeddings", 0);
    token_ids(root, c);
    SETI(root, "media_placeholder_token_id", c->vocab - SYNTH_SPECIALS + SP_MEDIA_PAD);
    json_object_set_new(root, "vision_config", vision_config(c));
    json_object_set_new(root, "text_config", text_config(c));
    SETS(root, "mkmodel_preset", synth_preset_name(c->preset));
    SETI(root, "mkmodel_seed", (json_int_t)c->seed);
    if (c->preset == SYNTH_PRESET_ORACLE)
        json_object_set_new(root, "oracle", oracle_json());
    return json_render(root, out, "config.json", err);
}

int synth_tokenizer_config_render(const synth_config *c, shoal_buf *out, shoal_err *err)
{
    static const struct { int off; const char *text; } sp[] = {
        { 0, "[BOS]" }, { 1, "[EOS]" }, { 2, "<|end_of_msg|>" }, { 3, "<|open|>" },
        { 4, "<|close|>" }, { 5, "<|sep|>" }, { -1, "[PAD]" },
    };
    json_t *root = json_object(), *dec = json_object(), *extra = json_array();
    int base = c->vocab - SYNTH_SPECIALS;

    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        json_t *e = json_object();
        char id[16];
        snprintf(id, sizeof id, "%d", sp[i].off < 0 ? c->vocab - 1 : base + sp[i].off);
        SETS(e, "content", sp[i].text);
        SETB(e, "lstrip", 0);
        SETB(e, "normalized", 0);
        SETB(e, "rstrip", 0);
        SETB(e, "single_word", 0);
        SETB(e, "special", 1);
        json_object_set_new(dec, id, e);
        json_array_append_new(extra, json_string(sp[i].text));
    }
    json_object_set_new(root, "added_tokens_decoder", dec);
    json_object_set_new(root, "additional_special_tokens", extra);
    SETS(root, "bos_token", "[BOS]");
    SETS(root, "eos_token", "[EOS]");
    SETS(root, "pad_token", "[PAD]");
    SETB(root, "clean_up_tokenization_spaces", 0);
    SETI(root, "model_max_length", c->max_pos);
    SETS(root, "tokenizer_class", "TikTokenTokenizer");
    return json_render(root, out, "tokenizer_config.json", err);
}
