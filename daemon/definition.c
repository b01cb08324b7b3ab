/* Definition hashes (definition.h): the mixing of a sequence of words. */
#include "daemon/definition.h"

#include "core/shards.h"

uint64_t pd_definition_add(uint64_t h, uint64_t word)
{
    const uint64_t pair[2] = {h, word};
    return pd_shard_layout_hash(pair, 2); /* core's hash of a sequence of words: one mixing function for both */
}

uint64_t pd_definition_done(uint64_t h)
{
    return h ? h : 1;
}
