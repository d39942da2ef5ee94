# PostgreSQL 15 from Debian's packages, configured like the public
# postgres image (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB; data in
# /var/lib/postgresql/data), for machines without Docker Hub. Built by
# `make test-compose` (deploy/compose/test.sh) on the Debian base image.
ARG BASE_IMAGE=debian:bookworm
FROM ${BASE_IMAGE}
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
RUN mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql \
    && chmod 0700 /var/lib/postgresql/data
ENV PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint"]
