# TideMQ node image: `tidemq broker`, `tidemq namesrv` and the operator CLI.
#   docker build -t tidemq:latest .
# Ports: 10911 remoting (RocketMQ protocol), 10912 HA replication, 10913 admin HTTP
# (/health, /metrics); name server: 9876 remoting, 9877 HTTP. Store volume: /var/lib/tidemq.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/tidemq
COPY pyproject.toml setup.py README.md ./
COPY client ./client
COPY node ./node
COPY ha ./ha
COPY coordinator ./coordinator
COPY pipeline ./pipeline
RUN pip install '.[cluster,grpc]' \
    && useradd --system --uid 10001 --home-dir /var/lib/tidemq tidemq \
    && mkdir -p /var/lib/tidemq /etc/tidemq \
    && chown tidemq /var/lib/tidemq
COPY deploy/compose/broker.toml /etc/tidemq/broker.toml

USER 10001
VOLUME ["/var/lib/tidemq"]
EXPOSE 10911 10912 10913 9876 9877
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:10913/health', timeout=2).status != 200)"
ENTRYPOINT ["tidemq"]
CMD ["broker", "-c", "/etc/tidemq/broker.toml"]
