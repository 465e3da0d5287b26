/* vision.c — the k3 preset's vision tower and projector: 168 tensors.
 *
 * Owns: names, shapes and recipes of the tensors a text engine must skip
 * (k3.md §2: 168 `vision_tower.*` / `mm_projector.*` tensors in shards
 * 95-96).  The real names are not published; these follow MoonViT (Kimi-VL)
 * and are documented in docs/mkmodel.md:
 *
 *   vision_tower.patch_embed.proj.weight        BF16 [1152, 3, 14, 14]
 *   vision_tower.patch_embed.proj.bias          BF16 [1152]
 *   vision_tower.patch_embed.pos_emb.weight     BF16 [64, 64, 1152]
 *   vision_tower.patch_embed.pos_emb.time_weight BF16 [4, 1152]
 *   vision_tower.encoder.blocks.{0..12}.        12 each:
 *       norm0.{weight,bias} norm1.{weight,bias}  BF16 [1152]
 *       wqkv.weight [3456, 1152]  wqkv.bias [3456]
 *       wo.weight   [1152, 1152]  wo.bias   [1152]
 *       mlp.fc0.weight [4304, 1152]  mlp.fc0.bias [4304]
 *       mlp.fc1.weight [1152, 4304]  mlp.fc1.bias [1152]
 *   vision_tower.encoder.final_layernorm.{weight,bias}  BF16 [1152]
 *   mm_projector.pre_norm.{weight,bias}         BF16 [1152]
 *   mm_projector.linear_1.{weight,bias}         BF16 [4608, 4608], [4608]
 *   mm_projector.linear_2.{weight,bias}         BF16 [hidden, 4608], [hidden]
 *
 * 4 + 13·12 + 2 + 6 = 168.  The first shard holds the patch embedding and
 * blocks 0-6 (88 tensors), the second blocks 7-12, the final norm and the
 * projector (80).  About 0.5 GB in all.  Does not own the language tensors.
 */
#include "synth/synth_int.h"

#define VH      1152u        /* vision hidden size */
#define VI      4304u        /* vision MLP width */
#define VBLOCKS 13
#define VMERGE  4u           /* 2x2 patches merged before the projector */

#define VMAT(b, o, i, ...) \
    synth_add(b, SYNTH_INIT_MATRIX, SYNTH_BF16, 2, (uint64_t[]){ (o), (i) }, __VA_ARGS__)
#define VVEC(b, init, n, ...) synth_add(b, init, SYNTH_BF16, 1, (uint64_t[]){ (n) }, __VA_ARGS__)

static void vision_block(synth_builder *b, int k)
{
    static const char *const norms[] = { "norm0", "norm1" };
    const char *p = "vision_tower.encoder.blocks";

    for (int n = 0; n < 2; n++) {
        VVEC(b, SYNTH_INIT_NORM, VH, "%s.%d.%s.weight", p, k, norms[n]);
        VVEC(b, SYNTH_INIT_BIAS, VH, "%s.%d.%s.bias", p, k, norms[n]);
    }
    VMAT(b, 3 * VH, VH, "%s.%d.wqkv.weight", p, k);
    VVEC(b, SYNTH_INIT_BIAS, 3 * VH, "%s.%d.wqkv.bias", p, k);
    VMAT(b, VH, VH, "%s.%d.wo.weight", p, k);
    VVEC(b, SYNTH_INIT_BIAS, VH, "%s.%d.wo.bias", p, k);
    VMAT(b, VI, VH, "%s.%d.mlp.fc0.weight", p, k);
    VVEC(b, SYNTH_INIT_BIAS, VI, "%s.%d.mlp.fc0.bias", p, k);
    VMAT(b, VH, VI, "%s.%d.mlp.fc1.weight", p, k);
    VVEC(b, SYNTH_INIT_BIAS, VH, "%s.%d.mlp.fc1.bias", p, k);
}

void synth_vision_add(synth_builder *b, const synth_config *cfg, int first)
{
    uint64_t h = (uint64_t)cfg->hidden;

    b->shard = first;
    synth_add(b, SYNTH_INIT_MATRIX, SYNTH_BF16, 4, (uint64_t[]){ VH, 3, 14, 14 },
              "vision_tower.patch_embed.proj.weight");
    VVEC(b, SYNTH_INIT_BIAS, VH, "vision_tower.patch_embed.proj.bias");
    synth_add(b, SYNTH_INIT_MATRIX, SYNTH_BF16, 3, (uint64_t[]){ 64, 64, VH },
              "vision_tower.patch_embed.pos_emb.weight");
    VMAT(b, 4, VH, "vision_tower.patch_embed.pos_emb.time_weight");
    for (int k = 0; k < VBLOCKS; k++) {
        if (k == 7)
            b->shard = first + 1;
        vision_block(b, k);
    }
    VVEC(b, SYNTH_INIT_NORM, VH, "vision_tower.encoder.final_layernorm.weight");
    VVEC(b, SYNTH_INIT_BIAS, VH, "vision_tower.encoder.final_layernorm.bias");
    VVEC(b, SYNTH_INIT_NORM, VH, "mm_projector.pre_norm.weight");
    VVEC(b, SYNTH_INIT_BIAS, VH, "mm_projector.pre_norm.bias");
    VMAT(b, VMERGE * VH, VMERGE * VH, "mm_projector.linear_1.weight");
    VVEC(b, SYNTH_INIT_BIAS, VMERGE * VH, "mm_projector.linear_1.bias");
    VMAT(b, h, VMERGE * VH, "mm_projector.linear_2.weight");
    VVEC(b, SYNTH_INIT_BIAS, h, "mm_projector.linear_2.bias");
}
