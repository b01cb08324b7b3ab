/* Mixture handlers: PutMixture (create, confirm, append stages), GetMixture, ListMixtures, DeleteMixture. */
#ifndef PD_MIXTURES_H
#define PD_MIXTURES_H

#include <stdint.h>

#include "daemon/service.h"
#include "proto/frame.h"

void pd_on_put_mixture(pd_session *s, uint64_t id, const Permd__V1__PutMixture *m);
void pd_on_get_mixture(pd_session *s, uint64_t id, const Permd__V1__GetMixture *m);
void pd_on_list_mixtures(pd_session *s, uint64_t id, const Permd__V1__ListMixtures *m);
void pd_on_delete_mixture(pd_session *s, uint64_t id, const Permd__V1__DeleteMixture *m);

#endif
