//! Every request of a workload client is bounded as a k8sd call is: its answer within a total
//! deadline (headers and every byte of the body), and its body within a size cap.
//!
//! A workload API server is the tenant's: `<cluster>-kubeconfig` may point anywhere. kube-rs
//! collects a whole body before decoding it, so one that never ends would take the controller's
//! memory (and the whole fleet's renewals with it), and one that drips a byte at a time would
//! hold a refresh's places for as long as it likes: the per-read timeout never fires.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bounds of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// From the request to the last byte of its answer.
    pub total: Duration,
    /// The most bytes an answer's body may have.
    pub max_body_bytes: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            total: Duration::from_secs(30),
            // A Node, a Pod list of one node or a CSR is a few KiB to a few hundred.
            max_body_bytes: 4 * 1024 * 1024,
        }
    }
}

/// What went over a bound. Its text names the bound, never the answer.
#[derive(Debug, thiserror::Error)]
pub enum Exceeded {
    #[error("the workload API server did not answer within {0:?}")]
    Deadline(Duration),
    #[error("the workload API server's answer is larger than {0} bytes")]
    TooLarge(u64),
}

#[derive(Clone, Copy, Debug)]
pub struct BoundedLayer(pub Bounds);

impl<S> Layer<S> for BoundedLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bounded {
            inner,
            bounds: self.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Bounded<S> {
    inner: S,
    bounds: Bounds,
}

impl<S, B, RB> Service<Request<B>> for Bounded<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: Body<Data = Bytes>,
{
    type Response = Response<BoundedBody<RB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let bounds = self.bounds;
        let deadline = Instant::now() + bounds.total;
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = tokio::time::timeout_at(deadline, answer)
                .await
                .map_err(|_| Box::new(Exceeded::Deadline(bounds.total)) as BoxError)?
                .map_err(Into::into)?;
            Ok(response.map(|body| BoundedBody {
                inner: Box::pin(body),
                read: 0,
                bounds,
                deadline: Box::pin(tokio::time::sleep_until(deadline)),
            }))
        })
    }
}

/// An answer's body that fails once it passes the size cap or the request's deadline.
pub struct BoundedBody<B> {
    inner: Pin<Box<B>>,
    read: u64,
    bounds: Bounds,
    deadline: Pin<Box<Sleep>>,
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(Exceeded::Deadline(this.bounds.total)))));
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.read += data.len() as u64;
                    if this.read > this.bounds.max_body_bytes {
                        return Poll::Ready(Some(Err(Box::new(Exceeded::TooLarge(
                            this.bounds.max_body_bytes,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    type Chunks = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

    /// An answer whose body is `chunks` chunks of `chunk` bytes, each after `every`.
    fn answering(
        chunks: usize,
        chunk: usize,
        every: Duration,
    ) -> impl Service<Request<()>, Response = Response<Chunks>, Error = Infallible, Future: Send + 'static>
    {
        tower::service_fn(move |_: Request<()>| {
            use futures::StreamExt;
            let stream = futures::stream::iter(0..chunks)
                .then(move |_| async move {
                    tokio::time::sleep(every).await;
                    Ok(Frame::data(Bytes::from(vec![b'x'; chunk])))
                })
                .boxed();
            std::future::ready(Ok(Response::new(StreamBody::new(stream))))
        })
    }

    async fn read(
        service: impl Service<
            Request<()>,
            Response = Response<impl Body<Data = Bytes, Error = BoxError>>,
            Error = BoxError,
        >,
    ) -> Result<usize, String> {
        use tower::ServiceExt;
        let response = service
            .oneshot(Request::new(()))
            .await
            .map_err(|e| e.to_string())?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(body.to_bytes().len())
    }

    const BOUNDS: Bounds = Bounds {
        total: Duration::from_secs(30),
        max_body_bytes: 1000,
    };

    #[tokio::test(start_paused = true)]
    async fn an_answer_within_both_bounds_is_read_whole() {
        let service = BoundedLayer(BOUNDS).layer(answering(10, 100, Duration::from_secs(1)));
        assert_eq!(read(service).await, Ok(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn an_endless_body_is_cut_at_the_cap() {
        let service = BoundedLayer(BOUNDS).layer(answering(usize::MAX, 64, Duration::ZERO));
        assert_eq!(
            read(service).await,
            Err("the workload API server's answer is larger than 1000 bytes".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dripping_body_is_cut_at_the_deadline() {
        // A byte every 20 s: each read is quick enough for a per-read timeout.
        let service = BoundedLayer(BOUNDS).layer(answering(100, 1, Duration::from_secs(20)));
        assert_eq!(
            read(service).await,
            Err("the workload API server did not answer within 30s".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn headers_that_never_come_are_cut_at_the_deadline() {
        let silent = tower::service_fn(|_: Request<()>| async {
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        });
        let service = BoundedLayer(BOUNDS).layer(silent);
        assert_eq!(
            read(service).await,
            Err("the workload API server did not answer within 30s".to_owned())
        );
    }
}
